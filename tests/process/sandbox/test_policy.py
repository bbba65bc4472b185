"""The sandbox's grants, computed from a config and the files on disk (no process started)."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from supervisor.config.settings import Settings, StdioConfig
from supervisor.errors import SpawnError
from supervisor.process import sandbox
from supervisor.process.sandbox import policy
from supervisor.process.sandbox.install import installation
from supervisor.process.sandbox.policy import Context, Spec, grants_for, package_caches


def executable(path: Path, text: str = "#!/bin/sh\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def access(grants: sandbox.Grants) -> dict[str, str]:
    return {grant.path: grant.access for grant in grants.entries}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    return tmp_path / "home"


def of_npx(home: Path, spec: Spec, context: Context, **options: Any) -> sandbox.Grants:
    """The grants of an extension whose command is a package manager's (`npx`)."""
    tool = executable(home.parent / "tools" / "bin" / "npx")
    return grants_for(spec, command=str(tool), args=[], cwd=None, roots=[], context=context, **options)


def context(home: Path, *protected: Path, cwd: Path | None = None) -> Context:
    environ = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    return Context(environ, tuple(map(str, protected)), cwd=str(cwd or home.parent), tmp=str(home / "tmp"))


class TestInstallation:
    def test_a_venv_script_grants_the_venv_its_interpreter_and_its_editable_sources(
        self, tmp_path: Path
    ) -> None:
        """venv/bin/tool (#! venv python) -> the venv, the base Python's prefix, the .pth's sources."""
        base = tmp_path / "pythons" / "3.12"
        real = executable(base / "bin" / "python3.12")
        venv = tmp_path / "project" / ".venv"
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").symlink_to(real)
        (venv / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\n")
        source = tmp_path / "src"
        source.mkdir()
        site = venv / "lib" / "python3.12" / "site-packages"
        site.mkdir(parents=True)
        (site / "__editable__.x.pth").write_text(f"{source}\nimport os; print('not a path')\n")
        tool = executable(venv / "bin" / "tool", f"#!{venv / 'bin' / 'python'}\n")
        found, executables = installation(str(tool), path_env="", home="/nonexistent")
        assert {str(venv), str(base), str(source)} <= set(found)
        assert str(real) in executables

    def test_an_npm_bin_link_grants_the_whole_node_modules(self, tmp_path: Path) -> None:
        """A package's entry point needs its dependencies beside it: the outermost node_modules."""
        modules = tmp_path / "prefix" / "node_modules"
        entry = executable(modules / "@scope" / "server" / "dist" / "index.js", "#!/usr/bin/env node\n")
        (modules / ".bin").mkdir(parents=True)
        (modules / ".bin" / "server").symlink_to(entry)
        found, _ = installation(str(modules / ".bin" / "server"), path_env="/usr/bin", home="/nonexistent")
        assert str(modules) in found
        assert not any(path.startswith(str(modules) + "/") for path in found)

    def test_a_command_in_a_home_bin_grants_that_directory_not_the_home(self, home: Path) -> None:
        """~/bin/tool: its prefix would be the home itself, too broad; ~/bin instead."""
        tool = executable(home / "bin" / "tool")
        found, _ = installation(str(tool), path_env="", home=str(home))
        assert str(home / "bin") in found
        assert str(home) not in found


class TestGrants:
    def test_the_base_covers_system_directories_and_a_file_argument(self, home: Path) -> None:
        """System read-only, the script's directory; nothing of the home, no cache for a
        server that runs no package manager."""
        script = executable(home.parent / "servers" / "server.py")
        grants = grants_for(
            Spec(), command=sys.executable, args=[str(script)], cwd=None, roots=[], context=context(home)
        )
        granted = access(grants)
        assert granted["/usr"] == granted["/etc"] == "read"
        assert granted[str(script.parent)] == "read"
        assert not [path for path, kind in granted.items() if kind == "write"]
        assert not grants.environ
        assert str(home) not in granted
        assert granted["/etc/shadow"] == "hidden"  # inside /etc: covered
        assert str(home / ".ssh") not in granted  # not granted at all: nothing to hide

    def test_a_file_argument_beside_a_protected_path_grants_only_the_file(self, home: Path) -> None:
        """A script next to the daemon's config: the file, not its directory."""
        directory = home.parent / "etc"
        script = executable(directory / "server.py")
        (directory / "config.yaml").write_text("{}")
        ctx = context(home, directory / "config.yaml")
        granted = access(
            grants_for(Spec(), command="/bin/sh", args=[str(script)], cwd=None, roots=[], context=ctx)
        )
        assert granted[str(script)] == "read"
        assert str(directory) not in granted

    def test_a_grant_covering_secrets_and_the_daemon_hides_them(self, home: Path) -> None:
        """`read: [~]` shows the home but hides ~/.ssh and the daemon's state inside it."""
        state = home / ".local" / "state" / "mcp-supervisor"
        state.mkdir(parents=True)
        ctx = context(home, state)
        granted = access(
            grants_for(Spec(read=("~",)), command="/bin/sh", args=[], cwd=None, roots=[], context=ctx)
        )
        assert granted[str(home)] == "read"
        assert granted[str(home / ".ssh")] == granted[str(state)] == "hidden"

    def test_naming_a_secret_shows_it_but_never_the_daemons_own(self, home: Path) -> None:
        """`read: [~/.ssh]` is the user's explicit choice; the daemon's paths stay hidden whatever."""
        sockets = home / "run"
        sockets.mkdir()
        spec = Spec(read=("~/.ssh", "~"))
        granted = access(
            grants_for(spec, command="/bin/sh", args=[], cwd=None, roots=[], context=context(home, sockets))
        )
        assert granted[str(sockets)] == "hidden"
        assert str(home / ".ssh") not in granted or granted[str(home / ".ssh")] != "hidden"

    def test_a_symlink_into_the_daemons_own_is_never_followed(self, home: Path) -> None:
        """A server that plants `shared/x -> <socket dir>` under its glob grant gets nothing of it."""
        sockets, shared = home.parent / "run", home / "shared"
        sockets.mkdir()
        shared.mkdir()
        (shared / "x").symlink_to(sockets)
        (shared / "y").mkdir()
        ctx = context(home, sockets)
        granted = access(
            grants_for(
                Spec(read=("~/shared/*",)), command="/bin/sh", args=[], cwd=None, roots=[], context=ctx
            )
        )
        assert granted[str(shared / "y")] == "read"
        assert str(shared / "x") not in granted and str(sockets) not in granted

    def test_globs_and_tilde_expand_and_write_covers_read(self, home: Path) -> None:
        """`~/p*` matches each project; a path granted for writing is not also listed as readable."""
        for name in ("p1", "p2", "other"):
            (home / name).mkdir()
        spec = Spec(read=("~/p*",), write=("~/p2",))
        granted = access(
            grants_for(spec, command="/bin/sh", args=[], cwd=None, roots=[], context=context(home))
        )
        assert granted[str(home / "p1")] == "read"
        assert granted[str(home / "p2")] == "write"
        assert str(home / "other") not in granted

    def test_cwd_and_roots_are_readable(self, home: Path) -> None:
        cwd, root = home / "work", home / "docs"
        grants = grants_for(
            Spec(), command="/bin/sh", args=[], cwd=str(cwd), roots=[str(root)], context=context(home)
        )
        assert access(grants)[str(cwd)] == access(grants)[str(root)] == "read"

    def test_a_home_as_cwd_is_not_granted_as_a_whole(self, home: Path) -> None:
        """`cwd: ~` would show shell history, ~/.npmrc tokens and every client's config: the
        process starts there, but reads only what is granted (as a file argument in it would)."""
        grants = grants_for(
            Spec(), command="/bin/sh", args=[], cwd=str(home), roots=[], context=context(home)
        )
        assert str(home) not in access(grants)

    def test_network_none_does_not_get_what_resolv_conf_points_at(
        self, home: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """systemd-resolved's varlink socket sits beside its resolv.conf: no use, and a way out.
        (This host's /etc/resolv.conf is a plain file: the host's links are played.)"""
        resolve = home.parent / "run" / "systemd" / "resolve"
        resolve.mkdir(parents=True)
        monkeypatch.setattr(policy, "system_links", lambda: {str(resolve): "what /etc/resolv.conf points at"})
        for network, shown in (("all", True), ("outbound", True), ("none", False)):
            spec = Spec(network=network)
            grants = grants_for(spec, command="/bin/sh", args=[], cwd=None, roots=[], context=context(home))
            assert (str(resolve) in access(grants)) is shown, network

    def test_the_digest_follows_the_grants(self, home: Path) -> None:
        """Same config, same digest; one more path or another network mode, another digest."""
        digests = {
            grants_for(spec, command="/bin/sh", args=[], cwd=None, roots=[], context=context(home)).digest
            for spec in (Spec(), Spec(), Spec(read=("/srv",)), Spec(network="none"))
        }
        assert len(digests) == 3


class TestPackageCaches:
    @pytest.mark.parametrize(
        ("command", "caches"),
        [
            ("/usr/bin/npx", {".npm"}),
            ("/x/uvx", {".cache/uv", ".local/share/uv/python", ".local/share/uv/tools", ".cache/pip"}),
            ("/usr/bin/python3", {".cache/pip"}),
            ("/usr/bin/docker", set()),
        ],
    )
    def test_the_shared_ones_of_each_family(self, command: str, caches: set[str]) -> None:
        """Where npx, uvx and pip keep what they run: the user's, never an extension's to write."""
        found = package_caches([command], {"HOME": "/h"})
        assert {os.path.relpath(path, "/h") for path in found} == caches

    def test_the_wrappers_own_variables_win(self) -> None:
        found = package_caches(["npx"], {"HOME": "/h", "npm_config_cache": "/elsewhere/npm"})
        assert set(found) == {"/elsewhere/npm"}

    @pytest.mark.parametrize(
        ("command", "variables"),
        [
            ("npx", {"npm_config_cache", "YARN_CACHE_FOLDER", "BUN_INSTALL_CACHE_DIR"}),
            ("uvx", {"UV_CACHE_DIR", "UV_TOOL_DIR", "UV_TOOL_BIN_DIR", "UV_PYTHON_INSTALL_DIR"}),
            ("pipx", {"PIP_CACHE_DIR", "PIPX_HOME"}),
            ("docker", set()),
        ],
    )
    def test_a_package_manager_gets_a_private_cache_and_never_the_shared_one(
        self, home: Path, command: str, variables: set[str]
    ) -> None:
        tool = executable(home.parent / "tools" / "bin" / command)
        caches = home.parent / "caches"
        own = caches / "ext"
        grants = grants_for(
            Spec(),
            command=str(tool),
            args=[],
            cwd=None,
            roots=[],
            context=replace(context(home), caches=str(caches)),
            cache=str(own),
        )
        assert set(grants.environ) == variables
        assert all(Path(path).is_relative_to(own) for path in grants.environ.values())
        writable = [g.path for g in grants.entries if g.access == "write"]
        assert writable == ([str(own)] if variables else [])
        assert not any(path.startswith(str(home)) for path in access(grants))  # no ~/.npm, ~/.cache/uv

    def test_a_cache_its_own_env_names_is_its_own(self, home: Path) -> None:
        """npm_config_cache in the extension's env: that directory, writable; no private one for it."""
        named = home.parent / "its-npm"
        grants = of_npx(
            home,
            Spec(),
            context(home),
            own_env={"npm_config_cache": str(named)},
            cache=str(home.parent / "caches" / "ext"),
        )
        assert access(grants)[str(named)] == "write"
        assert "npm_config_cache" not in grants.environ
        assert "YARN_CACHE_FOLDER" in grants.environ

    def test_the_other_extensions_caches_are_hidden_inside_a_grant(self, home: Path) -> None:
        caches = home / ".cache" / "mcp-supervisor" / "extensions"
        (caches / "other").mkdir(parents=True)
        grants = of_npx(
            home, Spec(read=("~",)), replace(context(home), caches=str(caches)), cache=str(caches / "mine")
        )
        granted = access(grants)
        assert granted[str(caches)] == "hidden"
        assert granted[str(caches / "mine")] == "write"  # bound after the cover: it shows through


class TestExecutedByOthers:
    """A write grant never covers what the daemon, the user or another extension executes."""

    @pytest.fixture
    def layout(self, home: Path) -> dict[str, Path]:
        paths = {
            "npm": home / ".npm" / "_npx",
            "uv-tools": home / ".local" / "share" / "uv" / "tools",
            "uv-cache": home / ".cache" / "uv",
            "bin": home / ".local" / "bin",
        }
        for path in paths.values():
            path.mkdir(parents=True)
        return paths

    def test_inside_a_write_grant_they_are_bound_read_only(self, home: Path, layout: dict[str, Path]) -> None:
        environ = {"HOME": str(home), "PATH": f"{layout['bin']}:/usr/bin"}
        grants = of_npx(
            home, Spec(write=("~",)), Context(environ, cwd=str(home.parent), tmp=str(home.parent / "tmp"))
        )
        granted = access(grants)
        assert granted[str(home)] == "write"
        assert granted[str(home / ".npm")] == "read"
        assert granted[str(layout["uv-tools"])] == "read"
        assert granted[str(layout["uv-cache"])] == "read"
        assert granted[str(layout["bin"])] == "read"  # on PATH: the user runs what is there

    def test_a_write_grant_of_a_shared_cache_is_read_only(self, home: Path, layout: dict[str, Path]) -> None:
        grants = of_npx(home, Spec(write=("~/.npm", "~/.local/share/uv/tools/x")), context(home))
        by_path = {grant.path: grant for grant in grants.entries}
        assert by_path[str(home / ".npm")].access == "read"
        assert "shared package cache" in by_path[str(home / ".npm")].reason
        assert by_path[str(layout["uv-tools"] / "x")].access == "read"

    def test_the_daemons_own_installation_is_never_writable(self, tmp_path: Path, home: Path) -> None:
        """A write grant of the directory holding the daemon's interpreter and package."""
        top = os.path.commonpath([sys.prefix, str(Path(sandbox.__file__).parents[2])])
        grants = grants_for(
            Spec(write=(top,)), command="/bin/sh", args=[], cwd=None, roots=[], context=context(home)
        )
        granted = access(grants)
        assert granted.get(sys.prefix) == "read" or granted.get(top) == "read"
        assert granted.get(str(Path(sandbox.__file__).parents[2])) == "read" or granted.get(top) == "read"


class TestSandboxOf:
    def test_sandbox_false_is_unconfined(self) -> None:
        config = StdioConfig(command="ls", sandbox=False)
        assert sandbox.sandbox_for("x", config, Context({})) is None

    def test_defaults_are_merged_under_each_extension(self) -> None:
        """sandbox_defaults: network unless the extension gives one; paths from both."""
        settings = Settings(
            sandbox_defaults={"network": "none", "read": ["/a"]},
            extensions={"x": {"command": "ls", "sandbox": {"write": ["/b"]}}, "y": {"command": "ls"}},
        )
        made = sandbox.sandbox_for("x", settings.extensions["x"], Context({}))
        assert made is not None and made.spec == Spec(
            "none", ("/a",), ("/b",), tmp_max=512 * 1024**2, pids_max=1024, cache_max=2 * 1024**3
        )
        assert settings.extensions["y"].sandbox.network == "none"

    def test_true_is_the_default_and_a_change_of_the_defaults_changes_every_extension(self) -> None:
        """`sandbox: true` is `{}`; new defaults make each config compare different (a reload restarts it)."""
        before = Settings(extensions={"x": {"command": "ls", "sandbox": True}})
        after = Settings(sandbox_defaults={"read": ["/srv"]}, extensions={"x": {"command": "ls"}})
        assert before.extensions["x"] == Settings(extensions={"x": {"command": "ls"}}).extensions["x"]
        assert before.extensions["x"] != after.extensions["x"]

    def test_relative_paths_are_relative_to_cwd(self, home: Path) -> None:
        work = home / "work"
        (work / "data").mkdir(parents=True)
        grants = grants_for(
            Spec(write=("data",)), command="/bin/sh", args=[], cwd=str(work), roots=[], context=context(home)
        )
        assert access(grants)[str(work / "data")] == "write"

    def test_too_many_paths_are_refused_before_anything_starts(self, home: Path) -> None:
        """A glob matching more than MAX_GRANTS paths is a permanent spawn error naming the cause."""
        many = home / "many"
        many.mkdir()
        for i in range(sandbox.MAX_GRANTS + 1):
            (many / f"d{i}").mkdir()
        config = StdioConfig(command="/bin/sh", sandbox={"read": [f"{many}/*"]})
        made = sandbox.sandbox_for("x", config, context(home))
        assert made is not None
        with pytest.raises(SpawnError, match="narrow its globs") as caught:
            made.grants("/bin/sh")
        assert caught.value.permanent

    def test_a_status_while_starting_leaves_the_grants_to_the_launch(self, home: Path) -> None:
        """describe() computes the grants of one never launched (its digest), except while it
        starts: its launch computes them, and a status meanwhile shows no digest yet."""
        config = StdioConfig(command="/bin/sh")
        made = sandbox.sandbox_for("x", config, context(home))
        assert made is not None
        assert made.describe("/bin/sh", starting=True)["digest"] is None
        launched = made.grants("/bin/sh")  # as Run.wrap computes them
        assert made.describe("/bin/sh", starting=True)["digest"] == launched.digest
        never = sandbox.sandbox_for("y", config, context(home))
        assert never is not None and len(never.describe("/bin/sh")["digest"]) == 12
