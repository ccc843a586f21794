"""Table definitions and mapped classes of the queue."""

from sqla_queue.models.mapped import Job, JobExecution, map_classes
from sqla_queue.models.tables import (
    DEFAULT_PREFIX,
    SCHEMA_VERSION,
    ExecutionState,
    JobStatus,
    QueueTables,
    build_tables,
    parse_schema_version_comment,
    resolve_schema,
    schema_version_comment,
    translated_schema,
)

__all__ = [
    "DEFAULT_PREFIX",
    "SCHEMA_VERSION",
    "ExecutionState",
    "Job",
    "JobExecution",
    "JobStatus",
    "QueueTables",
    "build_tables",
    "map_classes",
    "parse_schema_version_comment",
    "resolve_schema",
    "schema_version_comment",
    "translated_schema",
]
