"""A bank of realistic tool definitions (names, descriptions, input schemas) for view and search tests.

Services of four kinds (``dev``, ``cloud``, ``office``, ``data``), each with a few resources and the
usual verbs on them, some renamed the way real servers name them (``send_message``,
``merge_pull_request``). :data:`QUERIES` are natural requests, each with the one tool that answers
it, written as a user would ask, not from the descriptions. Pure data; ``many.py`` serves it.
"""

from __future__ import annotations

from typing import Any

# service -> (display name, group, [(resource, singular, plural, fields, filters)])
SERVICES: dict[str, tuple[str, str, list[tuple[str, str, str, str, str]]]] = {
    "github": (
        "GitHub",
        "dev",
        [
            (
                "repository",
                "repository",
                "repositories",
                "name, visibility and default branch",
                "owner and topic",
            ),
            ("issue", "issue", "issues", "title, body, labels and assignees", "state, label and assignee"),
            (
                "pull_request",
                "pull request (PR)",
                "pull requests",
                "title, head and base branches and reviewers",
                "state, author and base branch",
            ),
            ("release", "release", "releases", "tag, title and release notes", "tag and date"),
        ],
    ),
    "gitlab": (
        "GitLab",
        "dev",
        [
            ("project", "project", "projects", "name, namespace and visibility", "group and archived state"),
            (
                "merge_request",
                "merge request (MR)",
                "merge requests",
                "source and target branches and title",
                "state and author",
            ),
            ("pipeline", "CI/CD pipeline", "CI/CD pipelines", "ref, variables and stages", "status and ref"),
            ("tag", "git tag", "git tags", "name, commit and message", "name pattern"),
        ],
    ),
    "jira": (
        "Jira",
        "dev",
        [
            (
                "ticket",
                "ticket",
                "tickets",
                "summary, description, priority and assignee",
                "status, sprint and JQL",
            ),
            ("sprint", "sprint", "sprints", "name, goal, start and end dates", "board and state"),
            ("epic", "epic", "epics", "name, summary and child tickets", "project and status"),
            (
                "worklog",
                "worklog (time spent)",
                "worklogs",
                "time spent, date and comment",
                "ticket and author",
            ),
        ],
    ),
    "sentry": (
        "Sentry",
        "dev",
        [
            (
                "error_issue",
                "error issue",
                "error issues",
                "stack trace, first and last seen and event count",
                "project, level and release",
            ),
            (
                "alert_rule",
                "alert rule",
                "alert rules",
                "conditions, thresholds and notification actions",
                "project",
            ),
            ("release", "release", "releases", "version, commits and deploys", "project"),
            ("dsn_key", "DSN client key", "DSN client keys", "label and rate limit", "project"),
        ],
    ),
    "npm": (
        "npm",
        "dev",
        [
            (
                "package",
                "package",
                "packages",
                "name, description, versions and maintainers",
                "keyword and scope",
            ),
            ("dist_tag", "dist-tag", "dist-tags", "tag name and version", "package"),
            ("access_token", "access token", "access tokens", "scope, expiry and read-only flag", "type"),
            (
                "advisory",
                "security advisory",
                "security advisories",
                "severity, affected versions and patch",
                "package and severity",
            ),
        ],
    ),
    "kubernetes": (
        "Kubernetes",
        "cloud",
        [
            ("pod", "pod", "pods", "containers, status, node and restarts", "namespace and label selector"),
            ("deployment", "deployment", "deployments", "replicas, image and rollout status", "namespace"),
            ("service", "service", "services", "type, ports and selector", "namespace"),
            ("namespace", "namespace", "namespaces", "labels and resource quotas", "label selector"),
        ],
    ),
    "docker": (
        "Docker",
        "cloud",
        [
            ("container", "container", "containers", "image, ports, volumes and state", "status and name"),
            ("image", "image", "images", "repository, tag, size and layers", "dangling and reference"),
            ("volume", "volume", "volumes", "driver, mount point and labels", "driver"),
            ("network", "network", "networks", "driver, subnet and attached containers", "driver and scope"),
        ],
    ),
    "s3": (
        "Amazon S3",
        "cloud",
        [
            ("bucket", "bucket", "buckets", "region, versioning and encryption", "region"),
            (
                "object",
                "object (file)",
                "objects (files)",
                "key, size, content type and storage class",
                "prefix",
            ),
            (
                "lifecycle_rule",
                "lifecycle rule",
                "lifecycle rules",
                "expiration and transitions to Glacier",
                "bucket",
            ),
            (
                "bucket_policy",
                "bucket policy",
                "bucket policies",
                "statements, principals and actions",
                "bucket",
            ),
        ],
    ),
    "ec2": (
        "Amazon EC2",
        "cloud",
        [
            (
                "instance",
                "virtual machine instance",
                "virtual machine instances",
                "instance type, AMI, state and public IP",
                "state, tag and availability zone",
            ),
            (
                "security_group",
                "security group (firewall)",
                "security groups",
                "inbound and outbound rules",
                "VPC",
            ),
            (
                "snapshot",
                "EBS volume snapshot",
                "EBS volume snapshots",
                "volume, size and start time",
                "owner",
            ),
            ("key_pair", "SSH key pair", "SSH key pairs", "name, fingerprint and type", "name"),
        ],
    ),
    "cloudflare": (
        "Cloudflare",
        "cloud",
        [
            (
                "dns_record",
                "DNS record",
                "DNS records",
                "type (A, CNAME, MX), name, content and TTL",
                "zone and type",
            ),
            ("zone", "zone (domain)", "zones (domains)", "domain name, plan and name servers", "status"),
            (
                "firewall_rule",
                "WAF firewall rule",
                "WAF firewall rules",
                "expression and action (block, challenge)",
                "zone",
            ),
            ("worker", "Worker script", "Worker scripts", "script, routes and bindings", "account"),
        ],
    ),
    "terraform": (
        "Terraform Cloud",
        "cloud",
        [
            ("workspace", "workspace", "workspaces", "name, VCS repo and Terraform version", "organization"),
            (
                "run",
                "run (plan and apply)",
                "runs",
                "message, plan output and apply status",
                "workspace and status",
            ),
            (
                "variable",
                "workspace variable",
                "workspace variables",
                "key, value and sensitive flag",
                "workspace",
            ),
            (
                "state_version",
                "state version",
                "state versions",
                "serial, outputs and resources",
                "workspace",
            ),
        ],
    ),
    "slack": (
        "Slack",
        "office",
        [
            ("message", "message", "messages", "text, thread and attachments", "channel, user and date"),
            ("channel", "channel", "channels", "name, topic, purpose and members", "private or public"),
            ("reminder", "reminder", "reminders", "text, time and recurrence", "user"),
            (
                "user_group",
                "user group (@handle)",
                "user groups",
                "handle, name and members",
                "include disabled",
            ),
        ],
    ),
    "gmail": (
        "Gmail",
        "office",
        [
            (
                "email",
                "email message",
                "email messages",
                "recipients, subject, body and attachments",
                "label, sender, unread and date",
            ),
            ("draft", "email draft", "email drafts", "recipients, subject and body", "query"),
            ("label", "label", "labels", "name, color and visibility", "type"),
            (
                "mail_filter",
                "mail filter rule",
                "mail filter rules",
                "criteria (from, subject) and actions",
                "none",
            ),
        ],
    ),
    "calendar": (
        "Google Calendar",
        "office",
        [
            (
                "event",
                "calendar event (meeting)",
                "calendar events",
                "title, start and end time, attendees and location",
                "time range and calendar",
            ),
            ("calendar", "calendar", "calendars", "name, time zone and color", "access role"),
            ("acl_rule", "sharing rule", "sharing rules", "grantee and role (reader, writer)", "calendar"),
            (
                "working_location",
                "working location",
                "working locations",
                "office, home or custom place and dates",
                "date range",
            ),
        ],
    ),
    "notion": (
        "Notion",
        "office",
        [
            ("page", "page", "pages", "title, parent and content blocks", "parent and last edited time"),
            ("database", "database", "databases", "title, properties and views", "workspace"),
            ("block", "content block", "content blocks", "type and rich text", "page"),
            ("comment", "comment", "comments", "rich text and discussion thread", "page or block"),
        ],
    ),
    "drive": (
        "Google Drive",
        "office",
        [
            ("file", "file", "files", "name, MIME type, size and owners", "folder, type and modified time"),
            ("folder", "folder", "folders", "name and parent folder", "parent"),
            (
                "permission",
                "sharing permission",
                "sharing permissions",
                "email, role (viewer, editor) and expiry",
                "file",
            ),
            ("shared_drive", "shared drive", "shared drives", "name, members and restrictions", "name"),
        ],
    ),
    "zoom": (
        "Zoom",
        "office",
        [
            (
                "meeting",
                "video meeting",
                "video meetings",
                "topic, start time, duration and join URL",
                "type and date",
            ),
            (
                "recording",
                "cloud recording",
                "cloud recordings",
                "files, duration and transcript",
                "meeting and date",
            ),
            ("webinar", "webinar", "webinars", "topic, panelists and registration", "date"),
            (
                "registrant",
                "webinar registrant",
                "webinar registrants",
                "name, email and approval status",
                "webinar",
            ),
        ],
    ),
    "postgres": (
        "PostgreSQL",
        "data",
        [
            ("table", "table", "tables", "columns, types, constraints and row count", "schema"),
            ("row", "row (record)", "rows (records)", "column values", "a WHERE clause"),
            ("index", "index", "indexes", "columns, method (btree, gin) and uniqueness", "table"),
            ("role", "database role (user)", "database roles", "login, password and privileges", "name"),
        ],
    ),
    "mongodb": (
        "MongoDB",
        "data",
        [
            ("collection", "collection", "collections", "name, validator and document count", "database"),
            ("document", "document", "documents", "fields as JSON", "a filter query"),
            ("index", "index", "indexes", "keys, TTL and uniqueness", "collection"),
            (
                "aggregation",
                "saved aggregation pipeline",
                "saved aggregation pipelines",
                "stages as JSON",
                "collection",
            ),
        ],
    ),
    "bigquery": (
        "BigQuery",
        "data",
        [
            ("dataset", "dataset", "datasets", "location, expiration and labels", "project"),
            ("table", "table", "tables", "schema, partitioning and clustering", "dataset"),
            (
                "query_job",
                "SQL query job",
                "SQL query jobs",
                "SQL text, bytes processed and results",
                "state",
            ),
            ("view", "view", "views", "SQL definition", "dataset"),
        ],
    ),
    "stripe": (
        "Stripe",
        "data",
        [
            (
                "customer",
                "customer",
                "customers",
                "email, name and payment methods",
                "email and created date",
            ),
            ("invoice", "invoice", "invoices", "line items, amount due and due date", "customer and status"),
            (
                "subscription",
                "subscription",
                "subscriptions",
                "price, billing cycle and trial end",
                "customer and status",
            ),
            ("refund", "refund", "refunds", "charge, amount and reason", "charge"),
        ],
    ),
}

# Verb templates: (tool-name verb, description). {s} singular, {p} plural, {svc} the service's display name.
VERBS: list[tuple[str, str]] = [
    ("list", "List {p} in {svc}. Filter by {filters}; results are paginated with a cursor."),
    ("get", "Get one {s} in {svc} by its ID, with its {fields}."),
    ("create", "Create a new {s} in {svc}, given its {fields}."),
    ("update", "Update an existing {s} in {svc}: change its {fields}."),
    ("delete", "Delete a {s} from {svc}. This cannot be undone."),
    ("search", "Search {p} in {svc} by free text; returns the best matches first."),
]

# Real servers name some tools their own way: (service, resource, verb) -> (new verb, description).
RENAMES: dict[tuple[str, str, str], tuple[str, str]] = {
    ("slack", "message", "create"): ("send", "Send a message to a {svc} channel or thread, as the bot user."),
    ("gmail", "email", "create"): (
        "send",
        "Send an email from {svc} to one or more recipients, with attachments.",
    ),
    ("github", "pull_request", "update"): ("merge", "Merge a {s} in {svc} (merge, squash or rebase)."),
    ("gitlab", "pipeline", "update"): ("retry", "Retry the failed jobs of a {s} in {svc}."),
    ("kubernetes", "deployment", "update"): ("scale", "Scale a {s} in {svc} to a number of replicas."),
    ("kubernetes", "pod", "get"): (
        "logs",
        "Read the logs of a {s} in {svc} (a container's stdout and stderr).",
    ),
    ("docker", "container", "update"): ("restart", "Restart a running {s} in {svc}."),
    ("ec2", "instance", "update"): (
        "stop",
        "Stop (shut down) a running {s} in {svc}; it can be started again.",
    ),
    ("s3", "object", "get"): ("download", "Download an {s} from an {svc} bucket to a local path."),
    ("s3", "object", "create"): ("upload", "Upload a local file as an {s} to an {svc} bucket."),
    ("stripe", "refund", "create"): ("issue", "Issue a {s} for a charge in {svc}, in full or in part."),
    ("calendar", "event", "search"): ("free_busy", "Find free and busy times of people in {svc}."),
    ("zoom", "recording", "get"): ("transcript", "Get the transcript of a {s} in {svc}."),
    ("postgres", "row", "search"): ("query", "Run a read-only SQL query on {svc} and return the rows."),
    ("drive", "permission", "create"): (
        "share",
        "Share a file in {svc} with a person by email (grant access).",
    ),
}


def tools(count: int | None = None, groups: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The bank's tool definitions (plain JSON), in a fixed order; the first *count* of them."""
    out: list[dict[str, Any]] = []
    for service, (display, group, resources) in SERVICES.items():
        if groups is not None and group not in groups:
            continue
        for resource, singular, plural, fields, filters in resources:
            for verb, template in VERBS:
                verb, template = RENAMES.get((service, resource, verb), (verb, template))
                noun = _plural(resource) if verb in ("list", "search", "query") else resource
                text = template.format(s=singular, p=plural, svc=display, fields=fields, filters=filters)
                out.append(
                    {
                        "name": f"{service}_{verb}_{noun}",
                        "description": text,
                        "inputSchema": _schema(verb),
                    }
                )
    return out if count is None else out[:count]


def _plural(word: str) -> str:
    if word.endswith(("x", "s", "ch")):
        return word + "es"
    if word.endswith("y") and not word.endswith("ey"):
        return word[:-1] + "ies"
    return word + "s"


def group_of(service: str) -> str:
    return SERVICES[service][1]


def _schema(verb: str) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    if verb in ("list", "search", "query", "free_busy"):
        properties = {"query": {"type": "string"}, "cursor": {"type": "string"}, "limit": {"type": "integer"}}
    elif verb == "create":
        properties = {"fields": {"type": "object"}}
    else:
        properties = {"id": {"type": "string"}}
    return {"type": "object", "properties": properties}


# Natural requests and the tool (its own name) that answers each; written as a user would ask.
QUERIES: list[tuple[str, str]] = [
    ("open a pull request on github", "github_create_pull_request"),
    ("merge my PR", "github_merge_pull_request"),
    ("file a bug in github issues", "github_create_issue"),
    ("show the CI pipeline that failed again in gitlab, retry it", "gitlab_retry_pipeline"),
    ("list open merge requests", "gitlab_list_merge_requests"),
    ("log two hours of work on a jira ticket", "jira_create_worklog"),
    ("what tickets are in the current sprint", "jira_list_tickets"),
    ("find the stack trace of an error in sentry", "sentry_get_error_issue"),
    ("publish a new npm dist-tag", "npm_create_dist_tag"),
    ("check security advisories for an npm package", "npm_list_advisories"),
    ("show me the logs of a crashing pod", "kubernetes_logs_pod"),
    ("scale the web deployment to 5 replicas", "kubernetes_scale_deployment"),
    ("remove a kubernetes namespace", "kubernetes_delete_namespace"),
    ("restart the docker container", "docker_restart_container"),
    ("clean up unused docker volumes", "docker_delete_volume"),
    ("upload a file to s3", "s3_upload_object"),
    ("download an object from a bucket", "s3_download_object"),
    ("make a new S3 bucket", "s3_create_bucket"),
    ("shut down an ec2 virtual machine", "ec2_stop_instance"),
    ("open port 443 in the firewall security group", "ec2_update_security_group"),
    ("add a CNAME dns record", "cloudflare_create_dns_record"),
    ("block traffic with a WAF rule", "cloudflare_create_firewall_rule"),
    ("trigger a terraform plan and apply", "terraform_create_run"),
    ("set a sensitive terraform variable", "terraform_create_variable"),
    ("post a message in the #general slack channel", "slack_send_message"),
    ("remind me tomorrow at 9 on slack", "slack_create_reminder"),
    ("send an email to alice with the report attached", "gmail_send_email"),
    ("find unread emails from my boss", "gmail_search_emails"),
    ("save an email draft", "gmail_create_draft"),
    ("schedule a meeting with bob on thursday", "calendar_create_event"),
    ("when is everyone free this week", "calendar_free_busy_event"),
    ("create a notion page for the meeting notes", "notion_create_page"),
    ("comment on a notion page", "notion_create_comment"),
    ("share a google drive file with a colleague", "drive_share_permission"),
    ("make a new folder in drive", "drive_create_folder"),
    ("get the transcript of yesterday's zoom recording", "zoom_transcript_recording"),
    ("start a zoom video meeting", "zoom_create_meeting"),
    ("run a SQL query against postgres", "postgres_query_rows"),
    ("add an index to a postgres table", "postgres_create_index"),
    ("insert a document into a mongodb collection", "mongodb_create_document"),
    ("run a bigquery sql job", "bigquery_create_query_job"),
    ("refund a customer's payment", "stripe_issue_refund"),
    ("cancel a stripe subscription", "stripe_delete_subscription"),
    ("list unpaid invoices", "stripe_list_invoices"),
]
