# Runs inside tether-pbs-interpreter (tether.testing.pbs.ServerInterpreter), started as pbs_server
# starts its hook interpreter: no site, optimization level 2 (no asserts, no docstrings), no
# PYTHON* variables. Only the standard library and the stand-in pbs module are used here, so the
# C extensions that live through an interpreter restart (or do not) are the hook's own.
# argv: ROUND SPEC_JSON. The spec names the hook file, its config, the stand-in's directory, the
# events of every round and the output file; each event's outcome is appended there as JSON.
import builtins
import json
import sys
import traceback

round_no = int(sys.argv[1])
with open(sys.argv[2]) as fh:
    spec = json.load(fh)
sys.path.insert(0, spec["pbs_module_dir"])
import pbs  # noqa: E402  (the stand-in)

with open(spec["hook"]) as fh:          # the server compiles a hook file once and runs it per event
    code = compile(fh.read(), spec["hook"], "exec")
results = []
for event in spec["rounds"][round_no]:
    kw = dict(event)
    event_type = getattr(pbs, kw.pop("type").upper())
    e = pbs.stub_event(event_type, config_file=spec["hook_config"], **kw)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    outcome = {"round": round_no}
    try:
        exec(code, namespace)
        outcome["ended"] = "without accept() or reject() (PBS accepts)"
    except SystemExit:
        pass
    except BaseException as exc:  # what PBS reports as "hook '<name>' encountered an exception"
        outcome["exception"] = f"{type(exc).__name__}: {exc}"
        outcome["traceback"] = traceback.format_exc()
    job = e.job
    outcome.update(
        accepted=e.accepted, reject_msg=e.reject_msg, log=[m for _, m in pbs.LOG],
        resources={k: str(job.Resource_List[k]) for k in job.Resource_List.keys()},
        changed=sorted(job._changed),
        attributes={k: (None if getattr(job, k) is None else str(getattr(job, k)))
                    for k in ("queue", "Rerunable", "umask", "project", "comment")})
    results.append(outcome)
with open(spec["output"], "a") as fh:
    fh.write(json.dumps(results) + "\n")
