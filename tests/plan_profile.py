"""What tests/plan.sh's step-time checks share: a profile file read as
build/plan reads it (`key = value` lines, `#` comments), the two records of
build/plan --json's output, and a flag's value on a command line."""
import json


def read_profile(path):
    """{key: value as written} of a profile file."""
    prof = {}
    for line in open(path):
        line = line.split("#")[0].strip()
        if "=" in line:
            k, v = [x.strip() for x in line.split("=", 1)]
            prof[k] = v
    return prof


def plan_records(out):
    """The "plan" and "plan_time" records of build/plan --json --profile."""
    recs = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    return [r for r in recs if r["type"] == "plan"][0], [r for r in recs if r["type"] == "plan_time"][0]


def flag(flags, name, default):
    """The integer after `name` in the list flags, or default."""
    return int(flags[flags.index(name) + 1]) if name in flags else default
