"""Command templates for the shell backend: one dict per engine, overridable key by key.

Placeholders (Python `str.format`): `{name}` the job's name, `{id}` the engine's id,
`{ids}` every polled job's engine id, comma-separated (in `status_all`),
`{stage}` the job's staged directory as the job sees it, `{local_stage}` the same
directory on this machine, `{command}` / `{command_q}` the job command (raw / shell
quoted), `{python}`, and every key of `[backend.shell.vars]`. In the `*_regex` keys
`{id}` and `{name}` are replaced by their regex-escaped values.

The output formats parsed here follow each CLI's documentation; ratchet's tests run
them against fake CLIs (tests/backends/fakes), and Slurm also against a real
single-node Slurm (opt-in, `RATCHET_TEST_SLURM=1`).
"""

from __future__ import annotations

from typing import Any

SLURM = {
    "files": {
        "job.sh": "#!/bin/sh\n# ratchet job {name}\n{command}\n",
    },
    "submit": "sbatch --parsable --job-name {name} --output {stage}/engine.log "
              "--chdir {stage} {sbatch_args} {stage}/job.sh",
    "id_regex": r"^(?P<id>\d+)",
    # a submit whose answer was lost: the job is found by name before submitting again
    "id_command": "squeue -h --me -o '%i %j'",
    "id_list_regex": r"(?m)^\s*(?P<id>\d+)\s+{name}\s*$",
    # one call per tick for every job; a job that left the queue is judged by its log
    "status_all": "squeue -h --me -o '%i %T'",
    "status_all_regex": r"^\s*(?P<id>\d+)\s+(?P<state>[A-Z_]+)",
    "status": "squeue -h -j {id} -o %T",
    # squeue forgets finished jobs; sacct remembers them where accounting is set up,
    # and says so once where it is not (then the job's log alone decides)
    "status_fallback": "sacct -n -X -P -j {id} -o State",
    "fallback_unavailable_regex": r"(?i)accounting storage is disabled",
    "missing_regex": r"Invalid job id",
    "states": {
        "PENDING": "pending", "CONFIGURING": "pending", "REQUEUED": "pending",
        "RUNNING": "running", "COMPLETING": "running", "SUSPENDED": "running",
        "COMPLETED": "succeeded",
        "FAILED": "failed", "TIMEOUT": "failed", "NODE_FAIL": "failed", "BOOT_FAIL": "failed",
        "OUT_OF_MEMORY": "failed", "PREEMPTED": "failed", "DEADLINE": "failed",
        "CANCELLED": "cancelled",
    },
    "logs": "cat {stage}/engine.log",
    "cancel": "scancel {id}",
    "poll": 0.5,  # one squeue for all jobs per poll: cheap for slurmctld
    "vars": {"sbatch_args": ""},
}

VESSL = {
    "files": {},
    "submit": "vesslctl job create -n {name} -r {resource} -i {image} "
              "--object-volume {volume}:{volume_path} --cmd {command_q}",
    # the id appears in the list a little after `job create` returns
    "id_command": "vesslctl job list -o json",
    "id_json_name": "name",
    "id_json_id": "slug",
    "status": "vesslctl job show {id} -o json",
    "status_json": "workloadState",
    "missing_regex": r"(?i)not found|no such",
    "states": {
        "pending": "pending", "queued": "pending", "initializing": "pending",
        "scheduling": "pending", "running": "running", "succeeded": "succeeded",
        "completed": "succeeded", "failed": "failed", "terminated": "cancelled",
        "cancelled": "cancelled",
    },
    "logs": "vesslctl job logs --limit 1000 {id}",
    "cancel": "vesslctl job terminate {id}",
    "vars": {"resource": "cpu-small", "image": "python:3.11", "volume": "ratchet",
             "volume_path": "/shared"},
}

SKYPILOT = {
    "files": {
        "task.yaml": "name: {name}\n"
                     "resources:\n  accelerators: {accelerators}\n"
                     "run: |\n  {command}\n",
    },
    "submit": "sky jobs launch -n {name} -d -y {local_stage}/task.yaml",
    "id_command": "sky jobs queue",
    "id_list_regex": r"(?m)^\s*(?P<id>\d+)\s+\S+\s+{name}\s",
    "status_all": "sky jobs queue",  # one listing, parsed per job with status_regex
    "status": "sky jobs queue",
    "status_regex": r"(?m)^\s*{id}\s+\S+\s+\S+\s+(?:.*?\s)?(?P<state>PENDING|SUBMITTED|STARTING|"
                    r"RUNNING|RECOVERING|CANCELLING|SUCCEEDED|CANCELLED|FAILED\w*)\b",
    "states": {
        "PENDING": "pending", "SUBMITTED": "pending", "STARTING": "pending",
        "RUNNING": "running", "RECOVERING": "running", "CANCELLING": "running",
        "SUCCEEDED": "succeeded", "CANCELLED": "cancelled",
        "FAILED": "failed", "FAILED_SETUP": "failed", "FAILED_PRECHECKS": "failed",
        "FAILED_NO_RESOURCE": "failed", "FAILED_CONTROLLER": "failed",
    },
    "logs": "sky jobs logs --no-follow {id}",
    "cancel": "sky jobs cancel -y {id}",
    "vars": {"accelerators": "null"},
}

PRESETS: dict[str, dict[str, Any]] = {"slurm": SLURM, "vessl": VESSL, "skypilot": SKYPILOT}
