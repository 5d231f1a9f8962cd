#!/usr/bin/env python3
"""Benchmark: what tether adds to a containerized step -- `srun -N3 ... true` in one 3-node
allocation, as the job user, with real rootless podman and the sandbox's busybox image:

  direct   srun -N3 podman run <the same podman options tether uses> --rootfs IMG:O true
  tether   srun -N3 --container-image=IMG true   (SPANK hand-off, per-rank directories, the rank
           environment, tether's C rank launcher planning and supervising podman; goal <= 1.05 x
           direct)

and the same with the sandbox registry's busybox image (issue 14), warm (in the user's store) and
cold (removed from it before each round, untimed):

  direct   srun -N3 podman run … --pull=missing REGISTRY/tether/busybox:1 true   (each rank pulls)
  tether   srun -N3 --container-image=REGISTRY/tether/busybox:1 true  (one pull per node, then
           run --pull=never, by the Python launcher the C one hands registry images to; goal warm
           <= 1.05 x direct)

and the registry image in the user's store on cold and warm nodes (issue 46): cold, the job user
has no rootless-podman pause process on the node -- a compute node's state between jobs, since each
step's end ends the one its podman made; the user's pause process is killed by the PID podman
recorded before each cold round (untimed) -- and warm, one is kept by a holder step of the same
allocation on every node (what another step of the job, or a user's own podman, leaves). Each
sandbox node has its own /run, so both are done on the nodes through steps:

  tether-cold  srun -N3 --container-image=REGISTRY/tether/busybox:1 true on cold nodes (goal <= 1.2
               x tether-warm, and <= 1.05 x direct-cold)
  tether-warm  the same on warm nodes
  direct-cold  srun -N3 podman run … (tether's podman run directory) true on cold nodes

The kinds of steps are interleaved so drift hits all alike; the medians are printed, and the
median of the per-round ratios (single steps are noisy here: the three sandbox nodes' ranks all
get host CPU 0 from Slurm's cpuset, so a step's three podman starts and tether's three launchers
run on one core, one after the other; see the README's containers section for where the time goes). Run as root: /opt/tether/venv/bin/python bench/launch.py
[--only rootfs|registry|nodes] (TETHER_BENCH_SANDBOX_DIR: another sandbox directory than steps.ROOT)
"""

from __future__ import annotations

import os
import pwd
import shlex
import statistics

from tether.container.runtimes import adapter, podman
from tether.container.spec import LaunchSpec
from tether.system.proc import run_command
from tether.sandbox.cluster import Sandbox

from steps import ROOT, arguments, print_medians, step_times, timing_loop
from summary import record

def user_store(box: Sandbox) -> list[str]:
    """podman's options for the job user's store on the node, as tether's launcher passes them."""
    return podman.Podman(box.tether_settings()["container"]["podman"]).store_args(
        {}, uid=pwd.getpwnam(box.user).pw_uid)


def direct_podman(box: Sandbox, image: str) -> str:
    """The podman command line tether would run as the job user, minus its per-rank parts, as a
    shell string (the same store: the launch is built here, as root, without one, then given the
    user's)."""
    settings = box.tether_settings()["container"]["podman"]
    podman.stdio_is_terminal = lambda: False      # srun's tasks never are; this script may run on one
    launch = adapter("podman", {**settings, "store": ""}).launch(
        LaunchSpec(image=image, runtime="podman", command=("true",)), {})
    argv = ["--pull=missing" if a == "--pull=never" else a for a in launch.argv[:-1]]
    at = argv.index("--log-level=fatal")
    argv[at:at] = user_store(box)
    # built here as root, where the adapter leaves out what it gives every non-root user: yourself
    # inside the container (a user namespace of its own, which costs podman ~15 ms per container)
    if "--userns=keep-id" not in argv:
        argv.insert(argv.index("--entrypoint="), "--userns=keep-id")
    at = argv.index("--name")                      # three ranks on one host: podman picks names
    del argv[at:at + 2]
    return shlex.join(["env", *box.podman_env(), *argv])


def node_states(box: Sandbox) -> tuple[str, str]:
    """Shell commands for salloc's shell (the job user's) that make every node of the allocation
    cold or warm for the user. Each sandbox node has its own run directory (its own /run), so both
    act on the nodes through steps. Warm: a holder step on every node keeps a podman pause process
    of the user (podman unshare) -- as another step of the job would; the timed steps join it.
    Cold: the holder ends (its cgroup takes the pause process), and any pause process left on a
    node is killed by the PID podman recorded in tether's run directory, when that process has a
    pause process's name."""
    settings = box.tether_settings()["container"]["podman"]
    run = podman.Podman(settings).run_dir(pwd.getpwnam(box.user).pw_uid)
    names = "|".join(shlex.quote(name) for name in podman.PAUSE_NAMES)
    kill = (f"p=$(cat {shlex.quote(podman.pause_pid_file(run))} 2>/dev/null); "
            f"case \"$(cat /proc/$p/comm 2>/dev/null)\" in {names}) kill -KILL \"$p\" ;; esac")
    holder = shlex.join(["env", f"XDG_RUNTIME_DIR={run}", *[f"{k}={v}" for k, v in settings["env"].items()], "podman",
                         *settings["args"], *user_store(box), "unshare", "sh", "-c", "echo warm; exec sleep 100000"])
    cold = ('if [ -n "$HOLDER" ]; then kill "$HOLDER"; wait "$HOLDER" 2>/dev/null; HOLDER=; fi; '
            f"srun --overlap -N3 --ntasks-per-node=1 sh -c {shlex.quote(kill)}")
    warm = ('if [ -z "$HOLDER" ]; then : > warm.$$; '
            f"srun --overlap -N3 --ntasks-per-node=1 {holder} > warm.$$ 2>/dev/null & HOLDER=$!; "
            'for i in $(seq 300); do [ "$(grep -c warm warm.$$)" = 3 ] && break; sleep 0.1; done; fi')
    return cold, warm


def main() -> int:
    args = arguments(__doc__, rounds=30, groups=("rootfs", "registry", "nodes"))

    box = Sandbox(ROOT)
    box.up(install=False, log=lambda m: None)
    image = box.busybox_image()
    remote = box.registry_image()
    settings = box.tether_settings()["container"]["podman"]
    podman_cmd = shlex.join(["env", *box.podman_env(), "podman", *settings["args"], *user_store(box)])
    # each node its own store: forgotten on every node, by a step (the store is the node's)
    forget = f"srun --overlap -N3 --ntasks-per-node=1 {podman_cmd} rmi --force {shlex.quote(remote)} >/dev/null 2>&1"
    rootfs = {"direct": ("", f"srun -N3 -n3 {direct_podman(box, image)} true"),
              "tether": ("", f"srun -N3 -n3 --container-image={image} true")}
    registry = {"direct-warm": ("", f"srun -N3 -n3 {direct_podman(box, remote)} true"),
                "tether-warm": ("", f"srun -N3 -n3 --container-image={remote} true"),
                "direct-cold": (forget, f"srun -N3 -n3 {direct_podman(box, remote)} true"),
                "tether-cold": (forget, f"srun -N3 -n3 --container-image={remote} true")}
    cold, warm = node_states(box)
    run = podman.Podman(settings).run_dir(pwd.getpwnam(box.user).pw_uid)
    nodes = {"tether-cold": (cold, f"srun -N3 -n3 --container-image={remote} true"),
             "tether-warm": (warm, f"srun -N3 -n3 --container-image={remote} true"),
             "direct-cold": (cold, f"srun -N3 -n3 env XDG_RUNTIME_DIR={shlex.quote(run)} "
                                   f"{direct_podman(box, remote)} true")}
    # the image in the user's store first (untimed): the node's state is what differs, not a pull
    pulled = f"srun -N3 -n3 --container-image={remote} true >/dev/null 2>&1\n"
    try:
        # --exclusive: the whole nodes, so that the warm rounds' holder step leaves CPUs to the timed
        # steps; the holder ends with the loop
        out = {name: run_command(["runuser", "-u", box.user, "--", "salloc", "-N3", "--exclusive", "--time=30", "bash",
                                  "-c", (pulled if name == "nodes" else "") + timing_loop(args.rounds, cases)
                                  + ('[ -z "$HOLDER" ] || kill "$HOLDER"; rm -f warm.$$\n' if name == "nodes" else "")],
                                 env=box.command_env(), cwd=str(box.work_dir), timeout=1800).stdout
               for name, cases in (("rootfs", rootfs), ("registry", registry), ("nodes", nodes))
               if name in args.only}
    finally:
        removed = remove_baseline_cgroups(box)
        if removed:
            print(f"removed {removed} cgroup directories the direct podman runs left behind")
        if not args.keep:
            box.down(purge=False, log=lambda m: None)

    if "rootfs" in out:
        times = step_times(out["rootfs"], ("direct", "tether"))
        print_medians(f"containerized srun -N3 true inside a 3-node allocation, {args.rounds} interleaved rounds",
                      times)
        report("tether / direct", times["tether"], times["direct"], goal=1.05,
               figure="containerized `srun -N3 true`, rootfs directory: tether / the same podman under srun")
    if "registry" in out:
        times = step_times(out["registry"], tuple(registry))
        print_medians(f"the same with a registry image ({remote}), warm and cold", times)
        report("warm: tether / direct", times["tether-warm"], times["direct-warm"], goal=1.05,
               figure="the same, registry image in the user's store (warm)")
        report("cold: tether / direct", times["tether-cold"], times["direct-cold"], goal=None,
               figure="the same, registry image pulled (cold; tether: one pull per node)")
    if "nodes" in out:
        times = step_times(out["nodes"], tuple(nodes))
        print_medians(f"the same, registry image in the store, on cold nodes (no podman pause process of the "
                      f"user) and warm ones, {args.rounds} interleaved rounds", times)
        report("cold nodes: tether / tether on warm nodes", times["tether-cold"], times["tether-warm"], goal=1.2,
               figure="the same, registry image in the store, on cold nodes (no podman pause process of the "
                      "job user: a compute node between jobs) / on warm nodes (one left outside Slurm)")
        report("cold nodes: tether / direct", times["tether-cold"], times["direct-cold"], goal=1.05,
               figure="the same on cold nodes: tether / the same podman under srun")
    return 0


def remove_baseline_cgroups(box: Sandbox, root: str = "/sys/fs/cgroup") -> int:
    """What the direct baseline leaves: rootless podman's runc makes child cgroups below Slurm's
    step directories that nothing removes (tether's cgroup keeper removes its own), and Slurm then
    cannot remove its job directories either. A later job with the same id (a rebuilt sandbox)
    failed to start: "cpuset.cpus: Device or resource busy". Every empty directory below the
    sandbox nodes' uid_* directories goes, deepest first (rmdir refuses one with processes in it);
    run when no allocation is left. How many went."""
    removed = 0
    for controller in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        for node in box.nodes:
            top = os.path.join(root, controller, f"slurm_{node}")
            if os.path.islink(os.path.join(root, controller)) or not os.path.isdir(top):
                continue
            for users in os.scandir(top):
                if not (users.is_dir(follow_symlinks=False) and users.name.startswith("uid_")):
                    continue
                for path, _, _ in os.walk(users.path, topdown=False):
                    if path != users.path:
                        try:
                            os.rmdir(path)
                            removed += 1
                        except OSError:
                            pass
    return removed


def report(what: str, tether: list[float], direct: list[float], goal: float | None, figure: str) -> None:
    """The median of the per-round ratios, its quartiles, and the goal."""
    ratios = sorted(t / d for t, d in zip(tether, direct))
    q1, ratio, q3 = statistics.quantiles(ratios, n=4)
    verdict = f"; goal <= {goal:.2f}: {'ok' if ratio <= goal else 'MISSED'}" if goal else ""
    print(f"{what} = {ratio:.3f} (median of per-round ratios; quartiles {q1:.3f}..{q3:.3f}{verdict})")
    record("launch.py", figure, f"{ratio:.3f} ({q1:.2f}–{q3:.2f}); {statistics.median(tether):.0f} vs "
           f"{statistics.median(direct):.0f} ms", f"<= {goal:.2f}" if goal else "", ratio <= goal if goal else None)


if __name__ == "__main__":
    raise SystemExit(main())
