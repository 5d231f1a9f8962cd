"""The job_submit plugin's shape cache (job_submit/cache.c) against the handler itself.

A request of a known shape is answered in C with its own slot counts and image, no Python: that is
only right if the C answer is, field for field, what the handler answers for the same request. The
shim's cache.c and the image grammar (native/imageref.c) are compiled here as they are in the plugin;
thousands of generated requests -- counts the handler accepts and refuses, written plainly and not,
images valid and not, user options, partitions with overrides, several configurations -- go to the
handler and to the shape cache, and every answer the cache gives must equal the handler's.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tether.job_submit import build as job_submit_build
from tether.container.spec import mount_refusal, parse_mounts
from tether.hooks.errors import RequestError
from tether.hooks.surface import OPTIONS, RUNTIMES
from tether.job_submit.handler import ACCEPT, REJECT, Handler, checked_values, tether_values
from tether.native.build import source_dir as native_source_dir
from tether.testing.slurm import NO_VAL, NO_VAL16, JobSubmit, PluginLib, bridge_ffi

CACHE_API = """
struct tether_counts { int have_slots; unsigned long slots; int spn_given; unsigned long spn; };
char *tether_shape_key(const tether_job_t *job, struct tether_counts *counts);
int tether_shape_lookup(tether_job_t *job, const char *key, const struct tether_counts *counts);
void tether_shape_store(const tether_job_t *job, const char *key, int rc, unsigned long made_in);
char *tether_cache_key(const tether_job_t *job);
int tether_cache_lookup(tether_job_t *job, const char *key);
void tether_cache_store(const tether_job_t *job, const char *key, int rc, unsigned long made_in);
unsigned long tether_cache_generation(void);
long tether_partition_nodes(const char *name);
int tether_config_current(void);
int tether_request_values(tether_job_t *job);
void free(void *);
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    """cache.c and imageref.c compiled into a Python module (cffi), with bridge.h's struct."""
    import cffi

    src = job_submit_build.source_dir()
    shared = native_source_dir()
    ffi = cffi.FFI()
    cdef = job_submit_build.cdef().replace("[...]", "[1024]").replace("char msg[1024]", "char msg[2048]")
    ffi.cdef("\n".join(line for line in cdef.splitlines() if not line.startswith("#define")) + CACHE_API)
    # the plugin's other C (plugin.c) defines the handler's log and health calls; unused here
    glue = ('#include <stdlib.h>\n#include "cache.h"\n#include "request.h"\n'
            'void tether_log(int level, const char *msg) { (void)level; (void)msg; }\n'
            'void tether_set_health(int broken, int reject_all, const char *reason)\n'
            '{ (void)broken; (void)reject_all; (void)reason; }\n')
    ffi.set_source("_shape_cache_test", glue,
                   sources=[str(src / "cache.c"), str(src / "request.c"), str(shared / "imageref.c"),
                            str(shared / "values.c"),
                            str(shared / "option_values.c")],
                   include_dirs=[str(src), str(shared)], extra_compile_args=["-Wall", "-Werror"])
    out = tmp_path_factory.mktemp("shim")
    path = ffi.compile(tmpdir=str(out))
    import importlib.util
    spec = importlib.util.spec_from_file_location("_shape_cache_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ShimLib(PluginLib):
    """The handler's lib, whose config stamps reach the compiled cache (as in the plugin)."""

    def __init__(self, lib):
        super().__init__()
        self.lib = lib

    def tether_config_loaded(self, *args) -> None:
        self.lib.tether_config_loaded(*args)

    def tether_partitions_loaded(self, *args) -> None:
        self.lib.tether_partitions_loaded(*args)

    def tether_answers_per_user(self, yes: int) -> None:
        self.lib.tether_answers_per_user(yes)


CONFIGS = {
    "tres-gres": "default_compute_resource_pool: gpu\ndefault_aux_resource_pool: aux\n"
                 "job_project_source: account\npartition_overrides:\n  cpu:\n    slot_type: cpu\n"
                 "  a100:\n    gpu_type: a100\n",
    "gres-only": "tres_supported: false\ndefault_compute_resource_pool: gpu\n"
                 "partition_overrides:\n  cpu:\n    slot_type: cpu\n  v100:\n    gpu_type: v100\n",
    "no-gres": "tres_supported: false\ngres_supported: false\nslot_type: rocm\n",
    "tres-no-gres": "gres_supported: false\n",      # the fallback with a note: never shaped
    "by-user": "job_project_source: user\n",        # the WCKey is the user's name: answers per user
}
COUNTS = ["0", "1", "2", "3", "4", "6", "8", "12", "16", "24", "64", "96", "1000", "10000000", "10000001",
          "07", "", "x", "-1"]
SPNS = ["1", "2", "3", "4", "8", "12", "65533", "65534", "0", "02"]
IMAGES = ["ubuntu:22.04", "/shared/images/app.sif", "nvcr.io#nvidia/pytorch:24.01-py3", "docker://alpine:3",
          "localhost:5000/bench/app:r1-7", "", "bad image", "app.sif", "UPPER/case:1", "a" * 300]


# a job's own values the shape key stands for by their class (the last: --container-name)
PER_JOB = ("TETHER_CONTAINER_MOUNTS", "TETHER_CONTAINER_WORKDIR", "TETHER_CONTAINER_SAVE", "TETHER_CONTAINER_NAME")


def random_request(rng: random.Random, names: bool = True) -> dict:
    """A request as slurmctld hands it to job_submit, with tether options in spank_env (``names``:
    --container-env too; without, the stream test_job_submit_decisions recorded)."""
    env: dict[str, str] = {}

    def option(name: str, values: list[str], p: float) -> None:
        if rng.random() < p:
            spelled = rng.choices(["TETHER_", "_SLURM_SPANK_OPTION_tether_", "both"], [6, 1, 3])[0]
            key = name.upper().replace("-", "_")
            if spelled in ("TETHER_", "both"):
                env["TETHER_" + key] = rng.choice(values)
            if spelled != "TETHER_":
                env["_SLURM_SPANK_OPTION_tether_" + name.replace("-", "_")] = rng.choice(values)

    if rng.random() < 0.6:          # most requests: a size sweep of one shape, with or without an image
        env["TETHER_SLOTS"] = rng.choice(COUNTS)
        if rng.random() < 0.5:
            env["TETHER_SLOTS_PER_NODE"] = rng.choice(SPNS)
        if rng.random() < 0.5:
            env["TETHER_CONTAINER_IMAGE"] = rng.choice(IMAGES)
            if names and rng.random() < 0.3:      # its own variables' names: the same shape
                env["TETHER_CONTAINER_ENV"] = rng.choice(["A", "B,C", "VAR_" + str(rng.randrange(1000))])
            if names and rng.random() < 0.3:      # its own directories: the same shape, when plain
                n = rng.randrange(1000)
                env["TETHER_CONTAINER_MOUNTS"] = rng.choice([f"/scratch/u{n}:/data", f"/proj/{n}", f"/a/{n}:/b:ro",
                                                             f"/a/{n}:/b,/c:/d:rw"])
            if names and rng.random() < 0.2:
                env["TETHER_CONTAINER_WORKDIR"] = rng.choice([f"/work/{rng.randrange(1000)}", "rel/dir", "/"])
            if names and rng.random() < 0.2:      # its own file to save to: the same shape, when plain
                n = rng.randrange(1000)
                env["TETHER_CONTAINER_SAVE"] = rng.choice([f"/save/{n}.sqsh", f"out{n}.sqsh", f"/s/../{n}", "/"])
            if names and rng.random() < 0.3:      # its own container's name: the same shape, when valid
                n = rng.randrange(1000)
                env["TETHER_CONTAINER_NAME"] = rng.choices([f"job{n}", f"j.{n}-x_y", f"job{n}:create", f"job{n}:exec",
                                                            f"-job{n}", f"job {n}", f"job{n}:", "x" * 64],
                                                           [8, 4, 2, 1, 1, 1, 1, 1])[0]
                if rng.random() < 0.8:            # one that keeps named containers (the default may not)
                    env["TETHER_CONTAINER_RUNTIME"] = "podman"
        return {"spank_env": env, "uid": 1000}
    option("slots", COUNTS, 0.9)
    option("slots-per-node", SPNS, 0.6)
    option("slot-type", ["cuda", "rocm", "cpu", "tpu"], 0.1)
    option("gpu-type", ["a100", "h100"], 0.05)
    option("resource-pool", ["gpu", "cpu", "a100", "v100"], 0.1)
    option("container-image", IMAGES, 0.7)
    option("container-runtime", ["podman", "enroot", "apptainer"], 0.1)
    option("container-name", ["keep"], 0.02)
    # names the handler accepts (one shape whichever they are) and refuses (each its own request)
    if names:
        # plain bind mounts (one shape, whichever paths) and everything else (the handler's)
        option("container-mounts", ["/a:/b", "/a", "/a:/b:ro", "/a:/b:rw", "/a/b,/c:/d", "/x.y-z_1:/q",
                                    "/a:/tmp", "/tmp", "/a:/run/tether/workdir", "/", "/a:/", "/a:/b/",
                                    "/a:/b/../c", "/a:/./b", "/a://b", "/a:/b:ro+nosuid", "/a:/b:", "/a:/b:ro:x",
                                    "./rel:/b", "/a:rel", "/a:./b", "tmpfs:/t", "umount:/b", "/a:/b,", ",/a",
                                    "/a,,/b", "/a :/b", "/a:/b:RO", "/ä:/b", "/a:/b:nosuid", "/" + "a" * 5000,
                                    "/a:/tmp/x", "/a:/run/tether", ""], 0.3)
        option("container-workdir", ["/w", "w", "/a/../b", ".", "/", "/run/tether/workdir", "", "a\tb",
                                     "/ä", "x" * 5000], 0.1)
        option("container-env", ["A", "MY_VAR", "_x1,B", "A,B,C", "A" * 200, "1A", "A,,B", "A,", ",A", "", "A B",
                                 "A-B", "Ä", "A,1"], 0.3)
    job: dict = {"spank_env": env, "uid": rng.choices([1000, 1001], [9, 1])[0]}
    if rng.random() < 0.1:
        job["partition"] = rng.choice(["gpu", "cpu", "a100", "v100", "aux"])
    if rng.random() < 0.2:
        job["account"] = rng.choice(["proj", "other"])
    if rng.random() < 0.05:
        job["min_nodes"] = rng.choice([1, 2])
    if rng.random() < 0.05:
        job["tres_per_node"] = rng.choice(["gres:tmp:10", "gres:gpu:2", "gres:tmp:1,gres:nic:1"])
    if rng.random() < 0.05:
        job["cpus_per_task"] = 4
    return job


ANSWER = ("set_nodes", "out_min_nodes", "out_max_nodes", "set_num_tasks", "out_num_tasks", "set_ntasks_per_node",
          "out_ntasks_per_node", "set_cpus_per_task", "out_cpus_per_task", "set_requeue", "out_requeue",
          "set_tres_per_job", "out_tres_per_job", "set_tres_per_node", "out_tres_per_node", "set_tres_per_task",
          "out_tres_per_task", "set_partition", "out_partition", "set_wckey", "out_wckey", "set_features",
          "out_features", "msg")


def answer_of(ffi, c) -> dict:
    out = {}
    for name in ANSWER:
        value = getattr(c, name)
        out[name] = ffi.string(value) if name.startswith("out_t") or name in (
            "out_partition", "out_wckey", "out_features", "msg") else value
    return out


@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_every_answer_by_shape_is_the_handlers(shim, tmp_path, config_name):
    ffi, lib = shim.ffi, shim.lib
    config = tmp_path / "tether.yaml"
    config.write_text(CONFIGS[config_name])
    js = JobSubmit.__new__(JobSubmit)
    js.ffi, js.lib, js._keep = ffi, ShimLib(lib), []
    js.handler = Handler(ffi, js.lib, env={"TETHER_CONFIG": str(config)})
    assert js.handler.init() == ACCEPT
    rng = random.Random(f"shapes-{config_name}")
    users = random.Random(f"users-{config_name}")     # apart from rng: random_request's stream is recorded
    hits = slot_hits = other_counts = other_users = other_paths = other_names = shaped = 0
    stored: dict[bytes, tuple] = {}
    for n in range(2500):
        job = random_request(rng)
        job["uid"] = users.choice([1000, 1001, 1002, 4242])      # 4242: no such user
        truth = js.struct(job)
        rc = js.handler.submit(truth, job["uid"], 1)
        expected = answer_of(ffi, truth)

        probe = js.struct(job)
        counts = ffi.new("struct tether_counts *")
        key = lib.tether_shape_key(probe, counts)
        if key == ffi.NULL:         # nothing a shape stands for, or a count written otherwise
            continue
        text = ffi.string(key)
        found = lib.tether_shape_lookup(probe, key, counts)
        mine = (counts.slots, counts.spn, job["spank_env"].get("TETHER_CONTAINER_IMAGE"))
        if found:
            hits += 1
            slot_hits += bool(counts.have_slots and counts.slots > 0)    # slots: unset without have_slots
            other_counts += stored[text][0] != mine
            other_users += stored[text][1] != job["uid"]
            paths = tuple(job["spank_env"].get(v) for v in PER_JOB)
            other_paths += stored[text][2] != paths and any(paths)
            other_names += stored[text][2][-1] != paths[-1] and bool(paths[-1])
            assert (found, answer_of(ffi, probe)) == (rc, expected), (job, stored[text])
        if truth.shaped:
            shaped += 1
            assert rc == ACCEPT and ffi.string(truth.msg) == b""
            lib.tether_shape_store(truth, key, rc, lib.tether_cache_generation())
            stored[text] = (mine, job["uid"], tuple(job["spank_env"].get(v) for v in PER_JOB))
        lib.free(key)
    # the comparison means something: many answers (of jobs with slots) came from a shape another
    # request made, with other counts, and another user's; with the fallback's note on every such
    # answer, none does; where the WCKey is the user's, only the user's own shapes answer them
    if config_name == "tres-no-gres":
        assert slot_hits == 0 and hits > 0, (hits, shaped)
    elif config_name == "by-user":
        assert other_users == 0 and slot_hits >= 100, (other_users, slot_hits, shaped)
    else:
        # and with other plain --container-mounts / --container-workdir paths
        assert slot_hits >= 300 and other_counts >= 150 and other_users >= 150 and other_paths >= 25 and \
            other_names >= 3, (slot_hits, other_counts, other_users, other_paths, other_names, shaped)


def test_a_shape_key_stands_for_counts_and_image_only(shim):
    """Counts, the image, --container-env's names and nothing else leave the key: another partition,
    account, user option or container option is another shape; counts written otherwise than
    plainly have none."""
    ffi, lib = shim.ffi, shim.lib
    js = JobSubmit.__new__(JobSubmit)
    js.ffi, js._keep = ffi, []

    def key(**job):
        job.setdefault("spank_env", {})
        counts = ffi.new("struct tether_counts *")
        k = lib.tether_shape_key(js.struct(job), counts)
        if k == ffi.NULL:
            return None
        text = ffi.string(k)
        lib.free(k)
        return text, (counts.have_slots, counts.slots, counts.spn_given, counts.spn)

    base = {"TETHER_SLOTS": "8", "TETHER_SLOTS_PER_NODE": "4", "TETHER_CONTAINER_IMAGE": "ubuntu:22.04"}
    k8, c8 = key(spank_env=base)
    assert c8 == (1, 8, 1, 4)
    k2, c2 = key(spank_env={**base, "TETHER_SLOTS": "24", "TETHER_CONTAINER_IMAGE": "/x/y.sif"})
    assert (k2, c2) == (k8, (1, 24, 1, 4))
    assert key(spank_env={**base, "TETHER_SLOTS": "0"})[0] != k8                # zero slots: another row
    assert key(spank_env={**base, "TETHER_CONTAINER_IMAGE": "bad image"})[0] != k8
    assert key(spank_env={**base, "TETHER_CONTAINER_RUNTIME": "podman"})[0] != k8
    assert key(spank_env=base, partition="cpu")[0] != k8
    assert key(spank_env=base, account="proj")[0] != k8
    assert key(spank_env=base, tres_per_node="gres:tmp:1")[0] != k8
    assert key(spank_env=base, min_nodes=2)[0] != k8
    for odd in ("08", "+8", " 8", "8 ", "", "1e3", "10000001"):
        assert key(spank_env={**base, "TETHER_SLOTS": odd}) is None, odd
    for odd in ("0", "65534", "04"):
        assert key(spank_env={**base, "TETHER_SLOTS_PER_NODE": odd}) is None, odd
    forwarded = {"TETHER_SLOTS": "6", "_SLURM_SPANK_OPTION_tether_slots": "4"}
    assert key(spank_env=forwarded)[1] == (1, 6, 0, 1)                         # TETHER_SLOTS wins
    assert key(spank_env={"TETHER_CONTAINER_RUNTIME": "podman"}) is None          # nothing to stand for
    # --container-env's names, when the handler accepts them, leave the key too (issue 43: a request
    # that only names other variables is no new shape); names it refuses stay in it
    named = key(spank_env={**base, "TETHER_CONTAINER_ENV": "MY_VAR,_X1"})[0]
    assert named != k8 and key(spank_env={**base, "TETHER_CONTAINER_ENV": "OTHER"})[0] == named
    assert key(spank_env={**base, "_SLURM_SPANK_OPTION_tether_container_env": "A"})[0] != named
    for odd in ("1A", "A,,B", "A,", ",A", "", "A B", "A-B", "\u00c4", "A" * 5000):
        assert key(spank_env={**base, "TETHER_CONTAINER_ENV": odd})[0] not in (named, k8), odd
    assert NO_VAL and NO_VAL16


MOUNTS = ["/a:/b", "/a", "/a:/b:ro", "/a:/b:rw", "/a/b,/c:/d", "/x.y-z_1:/q", "/a..b:/c..d", "/:/host",
          "/a:/tmp", "/tmp", "/a:/run/tether/workdir", "/", "/a:/", "/a:/b/", "/a:/b/../c", "/a:/./b", "/a://b",
          "/a:/b/.", "/a:/b/..", "/a:/b:ro+nosuid", "/a:/b:", "/a:/b:ro:x", "./rel:/b", "/a:rel", "/a:./b",
          "tmpfs:/t", "umount:/b", "/a:/b,", ",/a", "/a,,/b", "/a :/b", " /a:/b", "/a:/b:RO", "/\u00e4:/b",
          "/a:/b:nosuid", "/" + "a" * 5000, "/a:/tmp/x", "/a:/run/tether", "/a:/b:x-create=dir", "", "/a:/run",
          "/a:/run/tether/batch-script", "/a:/run/tether/workdir/x", "/a:/run/user", "/a:/run/tethe", "/a:/ru"]
WORKDIRS = ["/w", "w", "/a/../b", ".", "/", "/run/tether/workdir", "", "a\tb", "/\u00e4", "x" * 4096, "x" * 4097,
            " /w", "/w\x7f"]
SAVES = ["/a/b.sqsh", "/x", "/a.b-c_d/e.tar", "/a..b/c", "rel.sqsh", "./x.sqsh", "../x", "/a/../b", "/a/./b", "//a",
         "/a//b", "/a/", "/", "", "/\u00e4.sqsh", "/a b", "/a:b", "/a\tb", " /a", "/" + "a" * 5000, "/a/."]
NAMES = ["a", "job-1.x_y", "A" * 63, "a:create", "a:exec", "a:no_exec", "a:auto", "A" * 64, "", "-a", ".a", "a b",
         "a:", "a:bad", "a:create:x", " a", "a ", "a/b", "\u00e4", "a\t", "a:CREATE"]


@pytest.mark.parametrize("name,values", [("TETHER_CONTAINER_MOUNTS", MOUNTS), ("TETHER_CONTAINER_WORKDIR", WORKDIRS),
                                         ("_SLURM_SPANK_OPTION_tether_container_mounts", MOUNTS[:12]),
                                         ("TETHER_CONTAINER_NAME", NAMES),
                                         ("_SLURM_SPANK_OPTION_tether_container_name", NAMES),
                                         ("TETHER_CONTAINER_SAVE", SAVES),
                                         ("_SLURM_SPANK_OPTION_tether_container_save", SAVES[:8])])
def test_plain_mounts_a_workdir_and_a_name_leave_the_shape_key_only_where_the_handler_takes_any(shim, tmp_path,
                                                                                              name, values):
    """A --container-mounts of plain bind mounts, any printable --container-workdir, any valid
    --container-name (its flag kept) and a plain absolute --container-save change no answer of the
    handler: such requests are one shape with a plain one (issue 43: pyxis users mount $PWD, name a
    container and save it, every job its own).
    Every value C takes so, the handler accepts with that answer; any other value stays in the key,
    the handler's to answer -- each case of the grammar tried."""
    ffi, lib = shim.ffi, shim.lib
    js = handler_on(shim, tmp_path, "tres-gres")
    base = {"TETHER_SLOTS": "8", "TETHER_SLOTS_PER_NODE": "4", "TETHER_CONTAINER_IMAGE": "ubuntu:22.04"}
    if name.upper().endswith(("NAME", "SAVE")):  # the config's runtime keeps no container
        refused = js.struct({"spank_env": {**base, name: values[0]}, "uid": 1000})
        assert js.handler.submit(refused, 1000, 1) == REJECT and not refused.shaped
        base["TETHER_CONTAINER_RUNTIME"] = "podman"
    plain = {**base, name: values[0]}
    truth = js.struct({"spank_env": plain, "uid": 1000})
    assert js.handler.submit(truth, 1000, 1) == ACCEPT and truth.shaped
    shape = c_key(shim, lib.tether_shape_key, {"spank_env": plain})
    lib.tether_shape_store(truth, shape, ACCEPT, lib.tether_cache_generation())
    taken = []
    for value in values:
        job = {"spank_env": {**base, name: value}, "uid": 1000}
        mine = js.struct(job)
        rc = js.handler.submit(mine, 1000, 1)
        probe = js.struct(job)
        counts = ffi.new("struct tether_counts *")
        key = lib.tether_shape_key(probe, counts)
        found = lib.tether_shape_lookup(probe, key, counts)
        same = ffi.string(key) == shape
        lib.free(key)
        assert bool(found) == same, value
        if same:
            taken.append(value)
            assert (found, answer_of(ffi, probe)) == (rc, answer_of(ffi, mine)), value
    if name.upper().endswith("MOUNTS"):
        assert taken == [v for v in values if v in MOUNTS[:8] + ["/a:/tmp/x", "/a:/run/tether/workdir/x", "/a:/run/user",
                                                                  "/a:/run/tethe", "/a:/ru"]], taken
    elif name.upper().endswith("NAME"):          # the flag stays in the key: only the plain names
        assert taken == ["a", "job-1.x_y", "A" * 63], taken
    elif name.upper().endswith("SAVE"):          # absolute, in its normal form: relative ones are the handler's
        assert taken == [v for v in values if v in SAVES[:4]], taken
    else:
        assert taken == ["/w", "w", "/a/../b", ".", "/", "/run/tether/workdir", "x" * 4096, " /w"], taken


def test_an_answer_is_kept_only_if_the_cache_was_not_emptied_since_and_its_key_is_of_the_current_form(shim,
                                                                                                    tmp_path):
    """slurmctld makes a request's keys, the handler answers, then the answer is kept; from 23.02
    other requests are in the plugin meanwhile. A review found user B getting user A's WCKey: A's
    call reloaded a config with job_project_source: user, and its answer was kept under the key
    without the uid made before. Now an answer is kept only under a key of the form the tables
    hold, and only if they were not emptied since the answer was made (another request's reload);
    an answer made by a call that itself reloaded (no change of form) is kept, as before."""
    ffi, lib = shim.ffi, shim.lib
    js = handler_on(shim, tmp_path, "tres-gres")          # job_project_source: account: keys without the uid
    request = {"spank_env": {"TETHER_SLOTS": "2"}, "account": "proj"}

    def key_of(uid: int) -> bytes:
        return c_key(shim, lib.tether_cache_key, {**request, "uid": uid})

    def answered(wckey: bytes):
        job = js.struct({**request, "uid": 1001})
        job.cacheable, job.set_wckey = 1, 1
        ffi.memmove(job.out_wckey, wckey + b"\0", len(wckey) + 1)
        return job

    def found(key: bytes, uid: int) -> bytes | None:
        probe = js.struct({**request, "uid": uid})
        return ffi.string(probe.out_wckey) if lib.tether_cache_lookup(probe, key) else None

    a_key, b_key = key_of(1001), key_of(1002)
    assert a_key == b_key                                    # one key for both users
    lib.tether_answers_per_user(1)                           # A's call reloads: per user now
    lib.tether_cache_store(answered(b"alice"), a_key, ACCEPT, lib.tether_cache_generation())
    assert found(b_key, 1002) is None and found(key_of(1002), 1002) is None
    now = key_of(1001)                                       # a key of the current form is kept
    lib.tether_cache_store(answered(b"alice"), now, ACCEPT, lib.tether_cache_generation())
    assert found(now, 1001) == b"alice" and found(key_of(1002), 1002) is None
    # an answer made before another request's call emptied the tables is not kept
    made_in, before = lib.tether_cache_generation(), key_of(1001)
    lib.tether_answers_per_user(0)
    lib.tether_answers_per_user(1)
    lib.tether_cache_store(answered(b"old"), before, ACCEPT, made_in)
    assert found(before, 1001) is None
    # a call that reloaded the config itself (no change of form): its answer is kept
    lib.tether_answers_per_user(0)
    before = key_of(1001)
    (tmp_path / "tether.yaml").write_text(CONFIGS["tres-gres"] + "# another\n")
    js.handler.refresh()
    lib.tether_cache_store(answered(b""), before, ACCEPT, lib.tether_cache_generation())
    assert found(key_of(1002), 1002) == b""


def handler_on(shim, tmp_path, config_name: str) -> JobSubmit:
    """A JobSubmit whose handler's config stamps reach the compiled cache (as in the plugin)."""
    config = tmp_path / "tether.yaml"
    config.write_text(CONFIGS[config_name])
    js = JobSubmit.__new__(JobSubmit)
    js.ffi, js.lib, js._keep = shim.ffi, ShimLib(shim.lib), []
    js.handler = Handler(shim.ffi, js.lib, env={"TETHER_CONFIG": str(config)})
    assert js.handler.init() == ACCEPT
    return js


def c_key(shim, make, job: dict) -> bytes | None:
    """``make``'s key (tether_cache_key or tether_shape_key) of ``job``, freed."""
    ffi, lib = shim.ffi, shim.lib
    js = JobSubmit.__new__(JobSubmit)
    js.ffi, js._keep = ffi, []
    args = (js.struct(job),) if make is lib.tether_cache_key else (js.struct(job), ffi.new("struct tether_counts *"))
    k = make(*args)
    if k == ffi.NULL:
        return None
    text = ffi.string(k)
    lib.free(k)
    return text


# Two requests a raw libslurm client can send that once made the same key (issue 39, finding 7):
# the fields were joined with 0x1f, which a spank_job_env entry may hold; and a shape's class of a
# valid image ("TETHER_CONTAINER_IMAGE=#image") was spelled as a request could spell its image.
COLLIDING = [
    ({"TETHER_SLOTS": "4", "TETHER_SLOT_TYPE": "cpu"}, {"TETHER_SLOTS": "4\x1fTETHER_SLOT_TYPE=cpu"}),
    ({"TETHER_SLOTS": "4", "TETHER_SLOT_TYPE": "cpu"}, {"TETHER_SLOTS": "4\x1eTETHER_SLOT_TYPE=cpu"}),
    ({"TETHER_SLOTS": "4"}, {"TETHER_SLOTS": "4\x1f"}),
    ({"A": "1", "B": "2"}, {"A": "1\x1fB=2"}),
]


@pytest.mark.parametrize("plain,crafted", COLLIDING)
def test_a_separator_inside_an_entry_is_another_request(shim, tmp_path, plain, crafted):
    """The exact collision of finding 7: after the plain request was answered (and kept), the single
    crafted entry is not answered from the cache -- the handler refuses it, so must the plugin."""
    ffi, lib = shim.ffi, shim.lib
    js = handler_on(shim, tmp_path, "tres-gres")
    assert c_key(shim, lib.tether_cache_key, {"spank_env": plain}) != \
        c_key(shim, lib.tether_cache_key, {"spank_env": crafted})

    first = js.struct({"spank_env": plain, "uid": 1000})
    rc = js.handler.submit(first, 1000, 1)
    key = lib.tether_cache_key(first)
    lib.tether_cache_store(first, key, rc, lib.tether_cache_generation())
    lib.free(key)

    truth = js.struct({"spank_env": crafted, "uid": 1000})
    expected = js.handler.submit(truth, 1000, 1), answer_of(ffi, truth)
    probe = js.struct({"spank_env": crafted, "uid": 1000})
    key = lib.tether_cache_key(probe)
    found = lib.tether_cache_lookup(probe, key)
    lib.free(key)
    assert found == 0 or (found, answer_of(ffi, probe)) == expected


# entries as a raw libslurm client can send them: any bytes but NUL, the separators most of all
entry_text = st.text(st.sampled_from("AB=4\x1e\x1f:-v0c1#"), max_size=8)


@given(a=st.lists(entry_text, max_size=4), b=st.lists(entry_text, max_size=4),
       partition=st.sampled_from([None, "", "p", "p\x1fv-"]))
def test_two_requests_have_one_key_only_when_they_are_one_request(shim, a, b, partition):
    """The answers cache's key is injective: requests whose entries differ never share a key."""
    def job(entries):
        return {"spank_env": dict(e.split("=", 1) if "=" in e else (e, "") for e in entries),
                "partition": partition}

    ja, jb = job(a), job(b)
    same = list(ja["spank_env"].items()) == list(jb["spank_env"].items())  # entries in order
    assert (c_key(shim, shim.lib.tether_cache_key, ja) == c_key(shim, shim.lib.tether_cache_key, jb)) == same


def test_a_shapes_class_is_not_a_requests_entry(shim, tmp_path):
    """A valid image stands for its class in the shape key; an entry spelled as that class (not an
    image: the handler refuses it) is another key, never the shape's answer."""
    ffi, lib = shim.ffi, shim.lib
    js = handler_on(shim, tmp_path, "tres-gres")
    shaped = {"TETHER_SLOTS": "8", "TETHER_CONTAINER_IMAGE": "ubuntu:22.04"}
    spelled = {"TETHER_SLOTS": "8", "TETHER_CONTAINER_IMAGE": "#image"}
    assert c_key(shim, lib.tether_shape_key, {"spank_env": shaped}) != \
        c_key(shim, lib.tether_shape_key, {"spank_env": spelled})

    first = js.struct({"spank_env": shaped, "uid": 1000})
    rc = js.handler.submit(first, 1000, 1)
    assert rc == ACCEPT and first.shaped
    counts = ffi.new("struct tether_counts *")
    key = lib.tether_shape_key(first, counts)
    lib.tether_shape_store(first, key, rc, lib.tether_cache_generation())
    lib.free(key)

    truth = js.struct({"spank_env": spelled, "uid": 1000})
    expected = js.handler.submit(truth, 1000, 1)
    assert expected != ACCEPT
    probe = js.struct({"spank_env": spelled, "uid": 1000})
    key = lib.tether_shape_key(probe, counts)
    assert key != ffi.NULL
    found = lib.tether_shape_lookup(probe, key, counts)
    lib.free(key)
    assert found == 0


def test_the_handlers_quantity_codes_are_bridge_hs():
    """handler.py's Q_* and bridge.h's TETHER_Q_* are one list, written twice (cffi reads no #define)."""
    import re

    from tether.job_submit import handler

    text = (job_submit_build.source_dir() / "bridge.h").read_text()
    defined = {name: int(value) for name, value in re.findall(r"#define TETHER_Q_(\w+) (\d+)", text)}
    assert defined == {"SAME": handler.Q_SAME, "SLOTS": handler.Q_SLOTS, "SPN": handler.Q_SPN,
                       "NODES": handler.Q_NODES}


def test_the_partitions_sizes_are_the_handlers_reading_of_slurm_conf_and_kept_current(shim, tmp_path):
    """The note at submit (plugin.c partition_note) asks cache.c how many nodes a partition has:
    what the handler read of slurm.conf (its default partition for a job that names none; -1 for
    one it could not count), and a slurm.conf that changes sends the next request to the handler
    again, which reads it anew."""
    import time

    from tether.testing.slurm import bridge_ffi

    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.write_text("NodeName=n[1-3] CPUs=2\nPartitionName=debug Nodes=n[1-3] Default=YES\n"
                          "PartitionName=one Nodes=n2\nNodeSet=fat Feature=fat\nPartitionName=f Nodes=fat\n")
    config = tmp_path / "tether.yaml"
    config.write_text("default_compute_resource_pool: debug\n")
    lib = ShimLib(shim.lib)
    handler = Handler(bridge_ffi(), lib, env={"TETHER_CONFIG": str(config), "SLURM_CONF": str(slurm_conf)})
    assert handler.init() == ACCEPT
    nodes = shim.lib.tether_partition_nodes
    ffi = shim.ffi
    assert [nodes(ffi.NULL), nodes(b""), nodes(b"debug"), nodes(b"one"), nodes(b"f"), nodes(b"deb"), nodes(b"x")] \
        == [3, 3, 3, 1, -1, -1, -1]
    assert shim.lib.tether_config_current() == 1
    slurm_conf.write_text(slurm_conf.read_text() + "PartitionName=big Nodes=n[1-3],m[1-5]\n")
    time.sleep(0.25)                                   # the shim looks at the files every 0.2 s
    assert shim.lib.tether_config_current() == 0       # the handler is asked again ...
    handler.refresh()
    assert nodes(b"big") == 8 and shim.lib.tether_config_current() == 1      # ... and reads it anew


# ---- the values the shim reads for the handler (request.c) -----------------------------------------
def shim_values(shim, ffi, c) -> tuple[bytes, bool] | None:
    """request.c's reading of ``c`` (a tether_job_t of ``ffi``, another cffi instance than the shim's:
    the same bridge.h): the values it hands over and whether their mounts are plain; None when it
    hands over none. ``c.values`` is left NULL (the C buffer freed)."""
    if not shim.lib.tether_request_values(shim.ffi.cast("tether_job_t *", int(ffi.cast("uintptr_t", c)))):
        assert c.values == ffi.NULL
        return None
    data, plain = ffi.unpack(c.values, c.values_size), bool(c.plain_mounts)
    shim.lib.free(shim.ffi.cast("void *", int(ffi.cast("uintptr_t", c.values))))
    c.values, c.values_size, c.plain_mounts = ffi.NULL, 0, 0
    return data, plain


def give_values(shim, ffi, c, keep: list) -> bool:
    """Put request.c's reading of ``c`` into ``c``, as plugin.c does before the call."""
    read = shim_values(shim, ffi, c)
    if read is None:
        return False
    buf = ffi.new("char[]", read[0] + b"\0")
    keep.append(buf)
    c.values, c.values_size, c.plain_mounts = buf, len(read[0]), read[1]
    return True


OPTION_KEYS = [key for opt in OPTIONS for key in (opt.env, opt.spank_env)]
entry_value = st.binary(max_size=40).filter(lambda b: b"\0" not in b) | st.text(
    st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=40).map(str.encode) | \
    st.sampled_from([b"", b"4", b"16", b"0", b"07", b"yes", b"off", b"maybe", b"cuda", b"cpu", b"podman",
                     b"ubuntu:22.04", b"/a:/b", b"A,B", b"job1:create", b"user,pid", b"x" * 5000,
                     "\u00e9".encode() * 2049, b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"a\x7fb"])
entry = st.tuples(st.sampled_from(OPTION_KEYS) | st.sampled_from(["TETHER_X", "_SLURM_SPANK_OPTION_tether_",
                                                                   "_SLURM_SPANK_OPTION_other_slots", "HOME"]),
                  st.sampled_from([b"=", b""]), entry_value).map(lambda t: t[0].encode() + (t[1] + t[2] if t[1] else b""))


@given(entries=st.lists(entry, max_size=8))
@example(entries=[b"_SLURM_SPANK_OPTION_tether_slots=4", b"TETHER_SLOTS=8"])       # the plugin's value wins
@example(entries=[b"TETHER_SLOTS=8", b"_SLURM_SPANK_OPTION_tether_slots=4"])
@example(entries=[b"TETHER_SLOTS=8", b"TETHER_SLOTS=2", b"TETHER_SLOTS_PER_NODE=2"])   # the last one
@example(entries=[b"TETHER_SLOTS=2", b"TETHER_CONTAINER_WORKDIR=/d\xed\xa0\x80"])      # not UTF-8
@example(entries=[b"TETHER_SLOTS=2", b"TETHER_CONTAINER_SAVE=/a/\xc3.sqsh"])
@example(entries=[b"TETHER_CONTAINER_WRITABLE", b"TETHER_CONTAINER_IMAGE=", b"TETHER_SLOTS"])   # no '='
@example(entries=[b"TETHER_CONTAINER_READONLY=yes", b"_SLURM_SPANK_OPTION_tether_container_remap_root=off"])
@example(entries=[b"TETHER_CONTAINER_MOUNTS=/a:/b:ro,/c", b"TETHER_CONTAINER_IMAGE=/i.sqsh"])       # plain
@example(entries=[b"TETHER_CONTAINER_MOUNTS=tmpfs:/t", b"_SLURM_SPANK_OPTION_tether_container_mounts=/a:/b"])
def test_the_values_the_shim_reads_are_the_handlers(shim, entries):
    """For any spank_job_env -- options spelled both ways or one, given twice, without '=', values
    refused, not UTF-8 --, the values request.c hands the handler are the ones the handler reads
    and checks itself (tether_values, checked_values); and it hands over none only where the
    handler refuses a value (then it reads them itself and says which) or one is not UTF-8."""
    ffi = bridge_ffi()
    c = ffi.new("tether_job_t *")
    bufs = [ffi.new("char[]", e) for e in entries]
    array = ffi.new("char *[]", bufs or [ffi.NULL])
    c.spank_env, c.spank_env_size = array, len(bufs)
    read = shim_values(shim, ffi, c)
    try:
        mine = checked_values(tether_values([e.decode("utf-8", "replace") for e in entries]))
    except RequestError:
        mine = None
    if read is not None:
        parts = read[0].decode("utf-8").split("\0")
        assert dict(zip(parts[0:-1:2], parts[1::2])) == mine and len(parts) % 2 == 1, entries
        if read[1]:     # plain mounts: bind mounts the handler takes and no runtime refuses
            mounts = parse_mounts(mine["container-mounts"])
            assert mounts and all(m.kind == "bind" for m in mounts), mounts
            assert all(mount_refusal(mounts, runtime) is None for runtime in RUNTIMES)
    else:
        utf8 = all(_is_utf8(e) for e in entries)
        assert mine is None or not utf8, entries


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_with_the_shims_values_the_handler_decides_as_recorded(shim, tmp_path):
    """Every recorded decision (test_job_submit_decisions: the table and the seeded random
    requests, under every config) is the same when the handler takes the values request.c read;
    and the shim read them for most requests (the random ones give many values it refuses: the handler's)."""
    import json as jsonlib

    import test_job_submit_decisions as decisions_test

    recorded = jsonlib.loads(decisions_test.RECORDING.read_text(encoding="utf-8"))
    given_values: list[bool] = []

    def fill(js, c) -> None:
        given_values.append(give_values(shim, js.ffi, c, js._keep))

    found = decisions_test.decisions(tmp_path, prepare=fill)
    moved = {k: (recorded[k], v) for k, v in found.items() if recorded[k] != v}
    assert not moved, "\n".join(f"{k}:\n  recorded {r}\n  now      {v}" for k, (r, v) in moved.items())
    assert sum(given_values) >= 0.5 * len(given_values) and not all(given_values), (
        sum(given_values), len(given_values))
