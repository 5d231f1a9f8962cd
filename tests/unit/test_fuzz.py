"""Fuzzing everything a user controls that reaches root-run or daemon code (SECURITY.md lists it).

* SPANK option values and the job's environment: the C that validates them in srun/sbatch and in
  slurmstepd (spank/options.c, built here into a test library) accepts exactly what the Python side
  accepts (hooks.surface.normalize), byte for byte, for any text -- the two sides cannot drift.
* job_submit fields: the handler in slurmctld answers every request (accept, or reject with a
  message); it never fails with an internal error, whatever spank_job_env and job fields say.
* PBS resources and ``qsub -v`` values: the submit hook accepts or rejects with a message; never
  "internal error".
* Cache metadata and cleanup markers: reading them never raises, never blocks, and never yields a
  command or a name tether would not write.

The number of examples comes from the hypothesis profile (tests/conftest.py).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.container import cleanup
from tether.container.images import read_metadata
from tether.hooks.surface import BY_NAME, OPTIONS, PYXIS_ENV, env_fallbacks, expected, normalize
from tether.job_submit.handler import ACCEPT, REJECT, Handler
from tether.native.build import source_dir as native_source_dir
from tether.spank.build import source_dir
from tether.system.toolchain import CBuild
from tether.testing.slurm import PluginLib, bridge_ffi

from helpers import REPO, run_hook_file

from tether.testing.pbs import pbs_module  # noqa: E402

pbs = pbs_module()  # the stand-in (tether.testing)

# Text as users can give it: C strings (no NUL), any code point, control characters, long runs.
c_text = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=80) | \
    st.sampled_from(["", "0", "18", "10000000", "10000001", "00", "1" * 19, "cuda", "rocm", "cpu", "CPU",
                     "podman", "true", "yes", "maybe", "A,B", "A,,B", "_x,Y1", "1A", "a100", ".a", "a" * 128,
                     "a" * 129, "x" * 4096, "x" * 4097, "é" * 2049, "\x7f", "²", "١٢", "４"])

STUBS = r"""
/* What the SPANK plugin's options.c needs from Slurm and slurmstepd, for a test library. */
#include <stdarg.h>
#include <stdio.h>
#include <slurm/spank.h>
#include "jobdirs.h"

char tether_test_message[1024];

void tether_report(enum tether_level level, const char *msg)
{
	(void)level;
	snprintf(tether_test_message, sizeof(tether_test_message), "%s", msg);
}

void slurm_error(const char *fmt, ...)
{
	(void)fmt;
}

spank_err_t spank_option_register(spank_t sp, struct spank_option *opt)
{
	(void)sp;
	(void)opt;
	return ESPANK_SUCCESS;
}

const char *spank_strerror(spank_err_t err)
{
	(void)err;
	return "";
}
"""


@pytest.fixture(scope="module")
def options_c(tmp_path_factory):
    """spank/options.c with native/imageref.c and jobdirs.c, compiled as the plugin compiles them, in a
    ctypes library."""
    work = tmp_path_factory.mktemp("options-c")
    stubs = work / "stubs.c"
    stubs.write_text(STUBS)
    cbuild = CBuild(work)
    shared = native_source_dir()
    objects = [cbuild.compile(source_dir() / "options.c", include_dirs=[str(shared)], header_dirs=[shared])]
    objects += [cbuild.compile(shared / unit) for unit in ("imageref.c", "values.c", "option_values.c", "jobdirs.c")]
    objects.append(cbuild.compile(stubs, include_dirs=[str(shared)]))
    lib = ctypes.CDLL(str(cbuild.link(objects, work / "liboptions.so", shared=True)))
    lib.tether_opt_set.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    lib.tether_opt_value.restype = ctypes.c_char_p
    lib.tether_opt_value.argtypes = [ctypes.c_int]
    return lib


@given(index=st.integers(0, len(OPTIONS) - 1), value=c_text)
def test_the_c_and_python_validators_accept_exactly_the_same_values(options_c, index, value):
    opt = OPTIONS[index]
    options_c.tether_opts_clear()
    accepted = options_c.tether_opt_set(index, value.encode("utf-8"), b"--x", 0) == 0
    python = normalize(opt, value)
    assert accepted == (python is not None), (opt.name, value)
    if accepted:
        assert options_c.tether_opt_value(index).decode("utf-8") == python


@pytest.mark.parametrize("name, longest", [("container-name", 63), ("resource-pool", 128), ("gpu-type", 128)])
def test_a_names_length_limit_is_the_same_in_c_and_python_and_named(options_c, name, longest):
    """--container-name is the launcher's name rule (63); C once took 128, so a longer name passed
    srun and failed every rank."""
    index = next(i for i, o in enumerate(OPTIONS) if o.name == name)
    for value, ok in (("a" * longest, True), ("a" * (longest + 1), False)):
        options_c.tether_opts_clear()
        assert (options_c.tether_opt_set(index, value.encode(), f"--{name}".encode(), 0) == 0) is ok
        assert (normalize(OPTIONS[index], value) is not None) is ok
    message = ctypes.c_char.in_dll(options_c, "tether_test_message")
    said = ctypes.string_at(ctypes.addressof(message)).decode()
    assert f"(at most {longest} characters)" in said and f"(at most {longest} characters)" in expected(OPTIONS[index])


@pytest.mark.parametrize("value, ok", [
    ("dev", True), ("dev:auto", True), ("dev:no_exec", True), ("dev:create", True), ("a" * 63 + ":create", True),
    ("dev:exec", True), ("dev:", False), (":create", False), ("dev:create:x", False), ("dev::create", False),
    ("dev:Create", False), ("a" * 64 + ":auto", False), ("-dev:auto", False), ("d/v:auto", False)])
def test_pyxis_container_name_flags_are_checked_alike_in_c_and_python(options_c, value, ok):
    index = next(i for i, o in enumerate(OPTIONS) if o.name == "container-name")
    options_c.tether_opts_clear()
    assert (options_c.tether_opt_set(index, value.encode(), b"--container-name", 0) == 0) is ok
    assert (normalize(OPTIONS[index], value) == value) if ok else normalize(OPTIONS[index], value) is None
    if not ok:
        message = ctypes.c_char.in_dll(options_c, "tether_test_message")
        said = ctypes.string_at(ctypes.addressof(message)).decode()
        assert said.endswith("characters), FLAG one of auto, no_exec, exec, create"), said


IMAGE = OPTIONS.index(next(o for o in OPTIONS if o.kind == "image"))
IMAGE_EXAMPLES = [
    # accepted
    "/scratch/img.sif", "/opt/images/busybox", "ubuntu", "ubuntu:22.04", "nvcr.io#nvidia/pytorch:24.01-py3",
    "alice@nvcr.io#nvidia/pytorch:24.01-py3", "docker://busybox", "docker://nvcr.io#nvidia/pytorch",
    "127.0.0.1:5000/team/app:1.0", "localhost/app", "registry.example.com/a/b/c:v1.2-rc_3",
    "ubuntu@sha256:" + "a" * 64, "ghcr.io/org/app:2@sha256:" + "0" * 64, "oras://ghcr.io/org/app:1",
    "library://alpine:3.18", "docker-archive:/tmp/x.tar", "oci-archive:/tmp/x.tar", "a.b_c-d/e", "a__b",
    # refused
    "", "Ubuntu", "ubuntu:", ":tag", "ubuntu::1", "img.sif", "./img.sif", "../x", "a b", "a//b", "team/img.sqsh:1", "x.squashfs", "/a\nb",
    "-flag", "ubuntu:-x", "reg#", "#repo", "user@", "@sha256:" + "a" * 64, "alice@127.0.0.1:5000/app",
    "host:port/app", "host:123456/app", "a.b:5000#app", "a_#b", "oras://", "library:", "oras://a b",
    "docker://", "docker:///abs", "ubuntu@sha256:abc", "ubuntu:" + "t" * 129, "x" * 4097, "é", "/" + "x" * 4096,
]


@pytest.mark.parametrize("value", IMAGE_EXAMPLES)
def test_image_references_are_checked_alike_in_c_and_python(options_c, value):
    options_c.tether_opts_clear()
    accepted = options_c.tether_opt_set(IMAGE, value.encode("utf-8"), b"--container-image", 0) == 0
    assert accepted == (normalize(OPTIONS[IMAGE], value) is not None), value


reference_text = st.lists(st.sampled_from(list("abz09AZ._-:/@#") + ["docker://", "sha256:" + "f" * 32, "oras://"]),
                          max_size=20).map("".join)


@given(value=reference_text)
def test_reference_like_text_is_checked_alike_in_c_and_python(options_c, value):
    options_c.tether_opts_clear()
    accepted = options_c.tether_opt_set(IMAGE, value.encode("utf-8"), b"--container-image", 0) == 0
    assert accepted == (normalize(OPTIONS[IMAGE], value) is not None), value


# ---- the job_submit handler ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def handler(tmp_path_factory):
    config = tmp_path_factory.mktemp("config") / "tether.yaml"
    config.write_text("default_compute_resource_pool: gpu\njob_project_source: user\n")
    ffi = bridge_ffi()                              # the handler as tether.testing runs it
    h = Handler(ffi, PluginLib(), env={"TETHER_CONFIG": str(config)})
    assert h.init() == ACCEPT
    return ffi, h


option_entries = st.lists(st.tuples(st.sampled_from(OPTIONS), st.booleans(), c_text), max_size=6).map(
    lambda items: [f"{opt.spank_env if raw else opt.env}={value}" for opt, raw, value in items])
job_numbers = st.sampled_from([0, 1, 2, 7, 0xfffffffe, 0xffffffff])
small_numbers = st.sampled_from([0, 1, 4, 0xfffe, 0xffff])
tres = st.one_of(st.none(), st.sampled_from(["gres:gpu:2", "gres/gpu:a100:1", "gres:nic:1", "gpu", ""]), c_text)


@given(env=option_entries, min_nodes=job_numbers, max_nodes=job_numbers, num_tasks=job_numbers,
       per_node=small_numbers, cpus=small_numbers, req=job_numbers, partition=st.one_of(st.none(), c_text),
       per_job=tres, per_node_tres=tres, per_task=tres)
def test_the_job_submit_handler_answers_every_request(handler, env, min_nodes, max_nodes, num_tasks, per_node,
                                                      cpus, req, partition, per_job, per_node_tres, per_task):
    ffi, h = handler
    job = ffi.new("tether_job_t *")
    keep = [ffi.new("char[]", e.encode("utf-8")) for e in env]      # cdata owners stay referenced
    array = ffi.new("char *[]", keep) if keep else ffi.NULL
    job.spank_env = array
    job.spank_env_size = len(keep)
    job.user_id, job.min_nodes, job.max_nodes, job.num_tasks = 1000, min_nodes, max_nodes, num_tasks
    job.ntasks_per_node, job.cpus_per_task, job.req_node_count = per_node, cpus, req % 5
    strings = {}
    for field, value in (("partition", partition), ("tres_per_job", per_job), ("tres_per_node", per_node_tres),
                         ("tres_per_task", per_task)):
        if value is not None:
            strings[field] = ffi.new("char[]", value.encode("utf-8"))
            setattr(job, field, strings[field])
    rc = h.submit(job, 1000, 1)
    assert rc in (ACCEPT, REJECT), h.lib.log[-3:]
    message = ffi.string(job.msg).decode("utf-8", "replace")
    if rc == REJECT:
        assert message.startswith("tether: ") and "internal error" not in message, message


# ---- the PBS submit hook -----------------------------------------------------------------------------
resource_values = st.one_of(st.integers(-5, 10**7), c_text, st.none())


@given(slots=resource_values, spn=resource_values, slot_type=resource_values, select=st.one_of(st.none(), c_text),
       variables=st.dictionaries(st.sampled_from([o.env for o in OPTIONS if o.is_container] + ["OTHER"]), c_text,
                                 max_size=4))
def test_the_pbs_submit_hook_answers_every_request(tmp_path_factory, slots, spn, slot_type, select, variables):
    hook_config = tmp_path_factory.getbasetemp() / "fuzz_submit.json"
    if not hook_config.exists():
        from tether.system.toolchain import tether_import_path

        hook_config.write_text(json.dumps({"python_path": [tether_import_path()], "config": {}}))
    resources = {k: v for k, v in (("tether_slots", slots), ("tether_slots_per_node", spn),
                                   ("tether_slot_type", slot_type), ("select", select)) if v is not None}
    try:
        event = pbs.stub_event(pbs.QUEUEJOB, config_file=str(hook_config), resources=resources,
                               Variable_List=variables)
    except pbs.BadAttributeValueError:              # a malformed select: qsub refuses it, no hook runs
        return
    e = run_hook_file(REPO / "pbs_hooks" / "tether_submit.py", event)
    if e.accepted is False:
        assert e.reject_msg.startswith("tether: ") and "internal error" not in e.reject_msg, e.reject_msg


# ---- cache metadata and cleanup markers ----------------------------------------------------------------
files = st.one_of(st.binary(max_size=300), st.builds(lambda d: json.dumps(d).encode(), st.dictionaries(
    st.sampled_from(["runtime", "container", "xdg_runtime_dir", "source", "commands", "env"]),
    st.one_of(c_text, st.integers(), st.lists(c_text, max_size=3), st.none()), max_size=5)))


@given(content=files)
def test_reading_metadata_never_fails(tmp_path_factory, content):
    path = tmp_path_factory.getbasetemp() / "meta.json"
    path.write_bytes(content)
    assert isinstance(read_metadata(str(path)), dict)


@given(content=files)
def test_a_marker_yields_only_what_tether_would_write(tmp_path_factory, content):
    path = tmp_path_factory.getbasetemp() / ".cleanup-0"
    path.write_bytes(content)
    marker = cleanup.read_marker(str(path))
    if marker is not None:
        assert set(marker) <= {"runtime", "container", "xdg_runtime_dir"}
        assert marker["runtime"] in ("apptainer", "singularity", "podman", "enroot")
        assert re.fullmatch(r"tether-[A-Za-z0-9_.-]+", marker["container"])
    os.unlink(path)


# -- the environment fallbacks: TETHER_<NAME>, then pyxis's PYXIS_CONTAINER_<NAME> (issue 45) --------
GETTER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)
FALLBACK_NAMES = sorted({o.env for o in OPTIONS if o.is_container} | {var for var, _, _ in PYXIS_ENV})
fallback_values = st.sampled_from(["", "1", "0", "y", "n", "yes", "no", "on", "off", "maybe", "true", "false",
                                   "/img", "ubuntu:22.04", "net", "net,uts", "ipc,foo", "net,", "dev:create",
                                   "/a:/b", "A,B", "x" * 4097])


def c_fallbacks(options_c, given: dict[str, str], env: dict[str, str]) -> tuple[int, dict[str, str]]:
    """spank/options.c's tether_env_fallbacks over ``env`` after ``given`` was typed: its return
    value and every option's value afterwards."""
    def get(_ctx, name, buf, size):
        value = env.get(name.decode())
        if value is None:
            return 0
        data = value.encode()[:size - 1] + b"\0"
        ctypes.memmove(buf, data, len(data))
        return 1

    callback = GETTER(get)
    options_c.tether_opts_clear()
    for name, value in given.items():
        assert options_c.tether_opt_set(OPTIONS.index(BY_NAME[name]), value.encode(), b"--x", 0) == 0
    options_c.tether_env_fallbacks.argtypes = [GETTER, ctypes.c_void_p]
    rc = options_c.tether_env_fallbacks(callback, None)
    values = {o.name: options_c.tether_opt_value(i).decode() for i, o in enumerate(OPTIONS)
              if options_c.tether_opt_value(i) is not None}
    return rc, values


def python_fallbacks(given: dict[str, str], env: dict[str, str]) -> tuple[int, dict[str, str]]:
    """hooks.surface.env_fallbacks, checked as the plugin checks a value: -1 when one is refused."""
    values = dict(given)
    for name, (value, _) in env_fallbacks(given, env).items():
        checked = normalize(BY_NAME[name], value)
        if checked is None:
            return -1, {}
        values[name] = checked
    return 0, values


@given(env=st.dictionaries(st.sampled_from(FALLBACK_NAMES), fallback_values, max_size=6),
       given_names=st.lists(st.sampled_from(["container-readonly", "container-writable", "container-image",
                                             "no-container-mount-home", "container-unshare"]), max_size=2,
                            unique=True))
def test_the_environment_fallbacks_are_the_same_in_c_and_python(options_c, env, given_names):
    typed = {name: {"container-image": "/typed", "container-unshare": "ipc"}.get(name, "1") for name in given_names}
    rc, values = c_fallbacks(options_c, typed, env)
    expected_rc, expected_values = python_fallbacks(typed, env)
    assert rc == expected_rc, (env, typed)
    if rc == 0:
        assert values == expected_values, (env, typed)


@pytest.mark.parametrize("typed, env, wanted", [
    # pyxis's variables alone: what the options would be
    ({}, {"PYXIS_CONTAINER_IMAGE": "ubuntu:22.04", "PYXIS_CONTAINER_MOUNTS": "/a:/b",
          "PYXIS_CONTAINER_WORKDIR": "/w", "PYXIS_CONTAINER_NAME": "c1", "PYXIS_CONTAINER_SAVE": "x.tar",
          "PYXIS_CONTAINER_ENV": "A,B", "PYXIS_CONTAINER_UNSHARE": "net,uts"},
     {"container-image": "ubuntu:22.04", "container-mounts": "/a:/b", "container-workdir": "/w",
      "container-name": "c1", "container-save": "x.tar", "container-env": "A,B", "container-unshare": "net,uts"}),
    # pyxis's booleans, both ways and in its spellings
    ({}, {"PYXIS_CONTAINER_MOUNT_HOME": "1", "PYXIS_CONTAINER_REMAP_ROOT": "y", "PYXIS_CONTAINER_ENTRYPOINT": "yes",
          "PYXIS_CONTAINER_WRITABLE": "true"},
     {"container-mount-home": "1", "container-remap-root": "1", "container-entrypoint": "1", "container-writable": "1"}),
    ({}, {"PYXIS_CONTAINER_MOUNT_HOME": "0", "PYXIS_CONTAINER_REMAP_ROOT": "n", "PYXIS_CONTAINER_ENTRYPOINT": "no",
          "PYXIS_CONTAINER_WRITABLE": "false", "PYXIS_CONTAINER_ENTRYPOINT_LOG": "0"},
     {"no-container-mount-home": "1", "no-container-remap-root": "1", "no-container-entrypoint": "1",
      "container-readonly": "1"}),
    ({}, {"PYXIS_CONTAINER_READONLY": "1"}, {"container-readonly": "1"}),
    ({}, {"PYXIS_CONTAINER_READONLY": "0"}, {"container-writable": "1"}),
    # WRITABLE is read before READONLY, which then changes nothing (pyxis's order)
    ({}, {"PYXIS_CONTAINER_WRITABLE": "1", "PYXIS_CONTAINER_READONLY": "1"}, {"container-writable": "1"}),
    # the command line wins over pyxis's variables, its partner of opposite meaning too
    ({"container-image": "/typed"}, {"PYXIS_CONTAINER_IMAGE": "ubuntu:22.04"}, {"container-image": "/typed"}),
    ({"container-readonly": "1"}, {"PYXIS_CONTAINER_WRITABLE": "1"}, {"container-readonly": "1"}),
    ({"no-container-mount-home": "1"}, {"PYXIS_CONTAINER_MOUNT_HOME": "1"}, {"no-container-mount-home": "1"}),
    ({"container-unshare": "ipc"}, {"PYXIS_CONTAINER_UNSHARE": "net"}, {"container-unshare": "ipc"}),
    # ... and over tether's own variables, which win over pyxis's
    ({"container-readonly": "1"}, {"TETHER_CONTAINER_WRITABLE": "1"}, {"container-readonly": "1"}),
    ({}, {"TETHER_CONTAINER_IMAGE": "/mine", "PYXIS_CONTAINER_IMAGE": "ubuntu:22.04"}, {"container-image": "/mine"}),
    ({}, {"TETHER_CONTAINER_READONLY": "1", "PYXIS_CONTAINER_WRITABLE": "1"}, {"container-readonly": "1"}),
    # empty: ignored, as pyxis ignores it
    ({}, {"PYXIS_CONTAINER_IMAGE": "", "PYXIS_CONTAINER_WRITABLE": ""}, {}),
])
def test_pyxis_variables_fill_in_what_the_command_line_and_tether_variables_leave(options_c, typed, env, wanted):
    assert python_fallbacks(typed, env) == (0, {**typed, **wanted})
    assert c_fallbacks(options_c, typed, env) == (0, {**typed, **wanted})


@pytest.mark.parametrize("env, said", [
    ({"PYXIS_CONTAINER_WRITABLE": "maybe"}, "tether: PYXIS_CONTAINER_WRITABLE=maybe: expected 1/0, true/false or yes/no"),
    ({"PYXIS_CONTAINER_UNSHARE": "net,foo"}, "tether: PYXIS_CONTAINER_UNSHARE=net,foo: unknown namespace 'foo'"),
    ({"PYXIS_CONTAINER_IMAGE": "x.sqsh"}, "tether: PYXIS_CONTAINER_IMAGE=x.sqsh: expected a path"),
])
def test_a_bad_pyxis_variable_is_refused_naming_it(options_c, env, said):
    rc, _ = c_fallbacks(options_c, {}, env)
    message = ctypes.c_char.in_dll(options_c, "tether_test_message")
    assert rc == -1 and ctypes.string_at(ctypes.addressof(message)).decode().startswith(said)
    assert python_fallbacks({}, env)[0] == -1


UNSHARE = OPTIONS.index(BY_NAME["container-unshare"])


@pytest.mark.parametrize("value, said", [
    ("net", None), ("ipc", None), ("uts", None), ("net,ipc,uts", None), ("uts,net", None), ("net,net", None),
    ("foo", "unknown namespace 'foo'"), ("net,foo", "unknown namespace 'foo'"), ("pid", "unknown namespace 'pid'"),
    ("NET", "unknown namespace 'NET'"), ("", "empty namespace argument"), ("net,", "empty namespace argument"),
    (",ipc", "empty namespace argument"), ("net,,ipc", "empty namespace argument"),
])
def test_container_unshare_takes_pyxis_namespaces_alike_in_c_and_python(options_c, value, said):
    options_c.tether_opts_clear()
    accepted = options_c.tether_opt_set(UNSHARE, value.encode(), b"--container-unshare", 0) == 0
    assert accepted is (said is None) and (normalize(OPTIONS[UNSHARE], value) is not None) is (said is None)
    if said:
        message = ctypes.c_char.in_dll(options_c, "tether_test_message")
        text = ctypes.string_at(ctypes.addressof(message)).decode()
        assert text.startswith(f"tether: --container-unshare={value}: {said} (expected namespaces separated "
                               f"by commas, of net, ipc, uts)"), text
