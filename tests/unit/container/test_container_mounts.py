"""Mounts (tether.container.spec's grammar, each runtime's spelling): pyxis 0.24's grammar and flags,
sources checked as the user reaches them, relative sources and the working directory, the home mount.
"""

from __future__ import annotations

import csv

import os
import subprocess
from pathlib import Path

import pytest

from tether.container.runtimes import adapter
from tether.container.spec import LaunchError, Mount, check_container_options, parse_mounts, spec_from_env

from container_helpers import HOST, _tether_run, conf_printed, spec


def test_mounts_parse_and_refuse_what_would_break_a_command_line():
    assert parse_mounts("/data:/data:ro, /scratch:/s,/opt") == (
        Mount("/data", "/data", True), Mount("/scratch", "/s"), Mount("/opt", "/opt"))
    for bad, why in (("data:/d", r"the source must be an absolute path, a relative path .* \(./data for"),
                     ("/a:/b:rx", "unknown flag .rx."), ("/a:d", r"the target must be .* \(./d\)"),
                     ("/a:/tmp", "tether's own"), ("/a:/run/tether/workdir", "tether's own"), ("/a:./", "tether's own"),
                     # above them (the user's mounts go over tether's and would hide them), and the script
                     ("/a:/run", "holds tether's own mount point /run/tether/workdir"),
                     ("/a:/run/tether/", "holds tether's own"),
                     ("/a:/run/tether/batch-script", "tether's own"),
                     ("/a:/b:ro:x", "unknown flag 'ro:x'"), ("/a::ro", "SRC:DST"), (":/b", "SRC:DST"),
                     ("devpts:/d", "the source must be")):
        with pytest.raises(LaunchError, match=why):
            parse_mounts(bad)


def test_mount_sources_are_checked_as_the_user_reaches_them(tmp_path, monkeypatch):
    """check_mount_sources: what is wrong with a source, in the user's words."""
    from tether.container.spec import check_mount_sources

    (tmp_path / "file").write_text("")
    check_mount_sources(parse_mounts(f"{tmp_path}:/a,{tmp_path}/file:/b"))
    with pytest.raises(LaunchError, match=f"^--container-mounts: {tmp_path}/file/x: Not a directory$"):
        check_mount_sources(parse_mounts(f"{tmp_path}:/a,{tmp_path}/file/x:/b"))
    with pytest.raises(LaunchError, match=r"^container.mounts in tether's config: /nope: source path does not exist"):
        check_mount_sources(parse_mounts(f"{tmp_path}:/a,/nope:/site"), admin=["/nope:/site"])

    def denied(path, *a, **kw):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(os, "stat", denied)
    with pytest.raises(LaunchError, match=r"^--container-mounts: /x: permission denied \(you cannot reach it on this node"):
        check_mount_sources(parse_mounts("/x:/y"))


def test_container_mount_home_on_off_or_the_runtimes_own_default(tmp_path):
    """Issue 15 (pyxis parity): --container-mount-home / --no-container-mount-home; neither: each
    runtime's own default (Apptainer/Singularity mount home, podman does not, enroot per its
    config). Both at once are refused, at submit too."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**HOST, "TETHER_CONTAINER_IMAGE": str(tmp_path), "HOME": str(home)}
    assert spec_from_env(env, ["true"], default_runtime="podman").mount_home is None
    on = spec_from_env({**env, "TETHER_CONTAINER_MOUNT_HOME": "1"}, ["true"], default_runtime="podman")
    off = spec_from_env({**env, "TETHER_NO_CONTAINER_MOUNT_HOME": "1"}, ["true"], default_runtime="podman")
    assert (on.mount_home, off.mount_home) == (True, False)
    with pytest.raises(LaunchError, match="ask for opposite things"):
        spec_from_env({**env, "TETHER_CONTAINER_MOUNT_HOME": "1", "TETHER_NO_CONTAINER_MOUNT_HOME": "1"}, ["true"],
                      default_runtime="podman")
    with pytest.raises(LaunchError, match="ask for opposite things"):
        check_container_options({"container-image": "/i", "container-mount-home": "1",
                                 "no-container-mount-home": "1"}, "podman")
    with pytest.raises(LaunchError, match="need --container-image"):
        check_container_options({"no-container-mount-home": "1"}, "podman")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    host = {**HOST, "HOME": str(home)}
    podman = adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman", mount_home=True), host).argv
    assert ["--volume", f"{home}:{home}"] in [podman[i:i + 2] for i in range(len(podman))]
    plain = adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman"), host).argv
    assert f"{home}:{home}" not in plain
    # with --container-remap-root at root's home, as enroot's home hook mounts it (pyxis's mount_home.bats)
    root = adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman", mount_home=True, remap_root=True),
                                        host).argv
    assert ["--volume", f"{home}:/root"] in [root[i:i + 2] for i in range(len(root))] and f"{home}:{home}" not in root
    # HOME=/tmp: refused at its own path (the rank's /tmp is there), mounted at /root (pyxis's env.bats)
    with pytest.raises(LaunchError, match="HOME='/tmp' is not a directory to mount"):
        adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman", mount_home=True), {**HOST, "HOME": "/tmp"})
    tmp_home = adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman", mount_home=True, remap_root=True),
                                            {**HOST, "HOME": "/tmp"}).argv
    assert ["--volume", "/tmp:/root"] in [tmp_home[i:i + 2] for i in range(len(tmp_home))]
    with pytest.raises(LaunchError, match="is not a directory to mount"):
        adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman", mount_home=True),
                                     {**HOST, "HOME": str(tmp_path / "nope")})
    sif = tmp_path / "img.sif"
    sif.write_text("")
    assert "--no-home" in adapter("apptainer", {}).launch(spec(image=str(sif), mount_home=False), host).argv
    assert "--no-home" not in adapter("apptainer", {}).launch(spec(image=str(sif), mount_home=True), host).argv
    sqsh = tmp_path / "img.sqsh"
    sqsh.write_text("")
    for value, expected in ((True, "y"), (False, "n"), (None, None)):
        launch = adapter("enroot", {}).launch(spec(image=str(sqsh), runtime="enroot", mount_home=value), host)
        assert launch.env.get("ENROOT_MOUNT_HOME") == expected


# ---- pyxis parity: remap-root, entrypoint, mount flags, save, the batch script, admin defaults (issue 15)
def test_mount_flags_are_joined_with_plus_as_pyxis_writes_them():
    (m,) = parse_mounts("/a:/b:ro+nosuid+rprivate")
    assert m == Mount("/a", "/b", True, ("nosuid", "rprivate")) and str(m) == "/a:/b:ro,nosuid,rprivate"
    assert str(parse_mounts("/a:/b:rw+nodev")[0]) == "/a:/b:nodev"
    for bad, why in (("/a:/b:ro+rw", "both ro and rw"), ("/a:/b:nosuid+suid", "both nosuid and suid"),
                     ("/a:/b:private+unbindable", "give one propagation"), ("/a:/b:x-create=link", "unknown flag")):
        with pytest.raises(LaunchError, match=why):
            parse_mounts(bad)


# ---- pyxis 0.24's mount grammar and workdir rules, on podman and enroot (issue 45) ------------------
def _pairs(argv: list[str]) -> list[list[str]]:
    return [argv[i:i + 2] for i in range(len(argv) - 1)]


def test_every_source_form_pyxis_takes_parses_and_each_target_becomes_absolute():
    """SRC is an absolute path, a relative one (any text starting with '.'), tmpfs or umount; DST
    absolute or relative to the container's root; the one-part form mounts a path at itself."""
    assert parse_mounts("./:/in,./file.txt:/f,../up:/u,.hidden:/h") == (
        Mount("./", "/in"), Mount("./file.txt", "/f"), Mount("../up", "/u"), Mount(".hidden", "/h"))
    assert parse_mounts("/var/lib,./data") == (Mount("/var/lib", "/var/lib"), Mount("./data", "/data"))
    assert parse_mounts("/a:./mnt/x,/b:/c/../d/./e/") == (Mount("/a", "/mnt/x"), Mount("/b", "/d/e"))
    assert parse_mounts("/tmp/a dir:/mnt/my mount:ro") == (Mount("/tmp/a dir", "/mnt/my mount", True),)
    assert parse_mounts("/x/../y:/z")[0].source == "/x/../y"          # as the kernel resolves it, on the node
    tmpfs, gone = parse_mounts("tmpfs:/scratch:size=1G+huge=within_size+mode=1777,umount:/root")
    assert (tmpfs.kind, tmpfs.options, tmpfs.create) == ("tmpfs", ("size=1G", "huge=within_size", "mode=1777"), "dir")
    assert gone == Mount("umount", "/root") and gone.kind == "umount"
    for bad, why in (("/a:../home", r"leads out of the container's root"), ("/a:/x/../../y", "leads out"),
                     ("tmpfs", "the target must be"), ("devpts:/d:ro", "the source must be"),
                     ("data/x:/d", r"\(./data/x for a path relative")):
        with pytest.raises(LaunchError, match=why):
            parse_mounts(bad)


def test_every_flag_pyxis_passes_to_enroot_that_means_something_is_taken():
    """ro/rw, [no]suid, [no]dev, [no]exec, each propagation with unbindable, bind/rbind (a bind is
    recursive either way, as pyxis's own flags always add rbind), x-create; empty flags are
    nothing (enroot skips them)."""
    (m,) = parse_mounts("/tmp:/mnt:unbindable+ro")
    assert (m.readonly, m.flags, str(m)) == (True, ("unbindable",), "/tmp:/mnt:ro,unbindable")
    (m,) = parse_mounts("/a:/b:suid+dev+exec+runbindable+bind+rbind+x-create=file")
    assert (m.flags, m.create) == (("suid", "dev", "exec", "runbindable"), "file")
    assert parse_mounts("/a:/b:,/c:/d:ro+") == (Mount("/a", "/b"), Mount("/c", "/d", True))
    for bad, why in (("tmpfs:/t:size=lots", "'size=lots' is not a value tmpfs takes"),
                     ("tmpfs:/t:huge=sometimes", r"huge= is one of never, always, within_size"),
                     ("tmpfs:/t:huge=deny", r"huge= is one of never, always, within_size, advise\)$"),  # sysfs only
                     ("tmpfs:/t:mode=999", "not a value"), ("tmpfs:/t:size=1G+size=2G", "size= twice"),
                     ("tmpfs:/t:rbind", "unknown flag 'rbind' for a tmpfs"), ("/a:/b:size=1G", "unknown flag"),
                     ("/a:/b:noatime", "unknown flag 'noatime'")):
        with pytest.raises(LaunchError, match=why):
            parse_mounts(bad)
    assert parse_mounts("tmpfs:/t:size=50%+nr_inodes=10k+uid=1000+gid=1000+ro+noexec")[0].options == (
        "size=50%", "nr_inodes=10k", "uid=1000", "gid=1000")


def test_relative_sources_are_resolved_on_the_node_from_the_working_directory_never_at_submit(tmp_path, monkeypatch):
    """pyxis's enroot mounts ``./x`` from the step's working directory on the node: the launcher
    (the user, in the task's working directory) resolves it, symlinks as the kernel follows them;
    the submit check (slurmctld, root) never looks at the file system for it."""
    from tether.container.spec import check_mount_sources, resolve_sources

    (tmp_path / "data").mkdir()
    (tmp_path / "in.txt").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "data")
    mounts = resolve_sources(parse_mounts("./:/w,../in.txt:/f,../link:/l,tmpfs:/t,umount:/u,/abs:/a"),
                             str(tmp_path / "data"))
    assert [m.source for m in mounts] == [str(tmp_path / "data"), str(tmp_path / "in.txt"), str(tmp_path / "data"),
                                          "tmpfs", "umount", "/abs"]
    # '..' after a symlink: from where the link leads (the kernel's walk), not a lexical shortening
    (tmp_path / "data" / "in.txt").write_text("y")
    (mount,) = resolve_sources(parse_mounts("./link/../data/in.txt:/g"), str(tmp_path))
    assert mount.source == str(tmp_path / "data/in.txt")
    (mount,) = resolve_sources(parse_mounts("/x/./y/../z:/g"), "/unused")
    assert mount.source == "/x/z"
    monkeypatch.chdir(tmp_path)
    env = {**HOST, "TETHER_CONTAINER_IMAGE": "/i", "TETHER_CONTAINER_MOUNTS": "./data:/d,./in.txt:/f"}
    s = spec_from_env(env, ["true"], default_runtime="podman")
    assert [m.source for m in s.mounts] == [str(tmp_path / "data"), str(tmp_path / "in.txt")]
    with pytest.raises(LaunchError, match=f"^--container-mounts: {tmp_path}/nope: source path does not exist"):
        check_mount_sources(spec_from_env({**env, "TETHER_CONTAINER_MOUNTS": "./nope:/n"}, ["true"],
                                          default_runtime="podman").mounts)
    check_mount_sources(parse_mounts("tmpfs:/t,umount:/u"))      # nothing on the host to check

    def touched(*a, **kw):
        raise AssertionError("the submit check looked at the file system")

    monkeypatch.setattr(os.path, "realpath", touched)
    monkeypatch.setattr(os, "getcwd", touched)
    check_container_options({"container-image": "/i", "container-mounts": "./data:/d,../x:/x"}, "podman")


def test_podman_gets_binds_as_volumes_tmpfs_as_tmpfs_and_umount_takes_a_mount_away(tmp_path):
    """podman (4.3 and 5 alike): a bind is ``--volume SRC:DST[:FLAGS]`` (a path with spaces as it
    is), a tmpfs ``--tmpfs DST[:size=,mode=,...]``; podman takes one mount a target, so a later
    entry replaces an earlier one and ``umount:DST`` drops what the admin, --container-mount-home
    or an earlier entry put there -- and is refused for anything else (podman's own mounts stay)."""
    rootfs, home = tmp_path / "rootfs", tmp_path / "home dir"
    rootfs.mkdir()
    home.mkdir()
    host = {**HOST, "HOME": str(home)}
    podman = adapter("podman", {})
    mounts = parse_mounts("/tmp/a dir:/mnt/my mount:ro+unbindable,tmpfs:/scratch:size=1G+mode=1777,"
                          "/x:/dup,/y:/dup:nosuid")
    argv = podman.launch(spec(image=str(rootfs), runtime="podman", mounts=mounts, mount_home=True), host).argv
    pairs = _pairs(argv)
    assert ["--volume", "/tmp/a dir:/mnt/my mount:ro,unbindable"] in pairs
    assert ["--tmpfs", "/scratch:size=1G,mode=1777"] in pairs
    assert ["--volume", "/y:/dup:nosuid"] in pairs and ["--volume", "/x:/dup"] not in pairs
    assert ["--volume", f"{home}:{home}"] in pairs
    gone = podman.launch(spec(image=str(rootfs), runtime="podman", mount_home=True,
                              mounts=parse_mounts(f"/a:/b,umount:{home},umount:/b")), host).argv
    assert not [a for a in gone if a.endswith((f":{home}", ":/b"))]
    with pytest.raises(LaunchError, match=r"umount:/proc: nothing is mounted there .* pyxis's enroot unmounts any"):
        podman.launch(spec(image=str(rootfs), runtime="podman", mounts=parse_mounts("umount:/proc")), host)
    # a tmpfs option podman's --tmpfs refuses (huge=, nr_inodes=, uid=, ...): an anonymous volume of
    # a tmpfs, every option to mount(8) (pyxis's mounts.bats: huge=within_size); a target with ','
    # or '"' quoted in --mount's CSV record
    odd = podman.launch(spec(image=str(rootfs), runtime="podman", mounts=parse_mounts(
        'tmpfs:/t:huge=within_size+nr_inodes=1k+noexec,tmpfs:/a b:uid=0+gid=0+ro')), host).argv
    assert ["--mount", 'type=volume,dst=/t,noexec,volume-opt=type=tmpfs,volume-opt=device=tmpfs,'
                       '"volume-opt=o=huge=within_size,nr_inodes=1k"'] in _pairs(odd)
    assert ["--mount", 'type=volume,dst=/a b,ro,volume-opt=type=tmpfs,volume-opt=device=tmpfs,'
                       '"volume-opt=o=uid=0,gid=0"'] in _pairs(odd)
    from tether.container.runtimes.podman import mount_args

    (record,) = mount_args(Mount(source="tmpfs", target='/x,"y', options=("huge=always",)))[1:]
    assert next(csv.reader([record])) == ["type=volume", 'dst=/x,"y', "volume-opt=type=tmpfs",
                                          "volume-opt=device=tmpfs", "volume-opt=o=huge=always"]
    with pytest.raises(LaunchError, match="as a volume, which takes no propagation flag .rprivate."):
        podman.launch(spec(image=str(rootfs), runtime="podman",
                           mounts=parse_mounts("tmpfs:/t:huge=always+rprivate")), host)
    assert ["--tmpfs", "/t:rprivate,size=1m"] in _pairs(podman.launch(
        spec(image=str(rootfs), runtime="podman", mounts=parse_mounts("tmpfs:/t:size=1m+rprivate")), host).argv)
    # accepted at submit for every runtime that mounts a tmpfs
    for runtime in ("podman", "enroot"):
        check_container_options({"container-image": "/i", "container-mounts": "tmpfs:/t:huge=within_size"}, runtime)
    for runtime in ("apptainer", "singularity"):
        for entry in ("tmpfs:/t", "umount:/u"):
            with pytest.raises(LaunchError, match=f"tether does no (tmpfs|umount) mounts with {runtime}"):
                check_container_options({"container-image": "/i.sif", "container-mounts": entry,
                                         "container-runtime": runtime}, "podman")
    sif = tmp_path / "img.sif"
    sif.write_text("")
    with pytest.raises(LaunchError, match="tether does no tmpfs mounts with apptainer"):
        adapter("apptainer", {}).launch(spec(image=str(sif), mounts=parse_mounts("tmpfs:/t")), HOST)


def test_a_relative_source_where_others_write_or_one_the_runtime_would_split_is_refused(tmp_path):
    """slurmstepd starts a step in /tmp when the job's directory is missing on the node: there
    ``./data`` may be another user's. A resolved source with ':' or ',' would be split by podman's
    --volume or Apptainer's --bind (enroot's fstab line carries it). A vanished working directory
    is a message, not a traceback."""
    from tether.container.spec import resolve_sources

    shared = tmp_path / "shared"
    (shared / "data").mkdir(parents=True)
    os.chmod(shared, 0o1777)
    with pytest.raises(LaunchError, match="a relative source in .*others can write .* is refused"):
        resolve_sources(parse_mounts("./data:/d"), str(shared), runtime="podman")
    assert resolve_sources(parse_mounts(f"{shared}/data:/d"), str(shared))[0].source == f"{shared}/data"  # absolute
    odd = tmp_path / "a:b,c"
    odd.mkdir()
    for runtime in ("podman", "apptainer"):
        with pytest.raises(LaunchError, match="would read as a separator"):
            resolve_sources(parse_mounts("./:/d"), str(odd), runtime=runtime)
    assert resolve_sources(parse_mounts("./:/d"), str(odd), runtime="enroot")[0].source == str(odd)
    with pytest.raises(LaunchError, match="the working directory is gone"):
        resolve_sources(parse_mounts("./x:/d"), str(tmp_path / "gone"), runtime="podman")


def test_an_enroot_mount_line_longer_than_enroot_reads_is_refused():
    """enroot-mount reads fstab lines into a 4096-byte buffer and getmntent cuts a longer one:
    escaped blanks (4 bytes each) could push ro,nosuid off the end, silently."""
    from tether.container.runtimes.enroot import FSTAB_LINE_MAX, fstab_line

    (mount,) = parse_mounts("/h:/" + "a " * 1010 + "x:ro+nosuid")
    with pytest.raises(LaunchError, match="more than enroot reads"):
        fstab_line(mount)
    assert len(fstab_line(parse_mounts("/h:/" + "a" * 2000)[0]).encode()) < FSTAB_LINE_MAX


def test_enroot_gets_every_mount_as_an_fstab_line_of_its_config_in_order(tmp_path):
    """enroot start's --mount refuses blanks (and splits on ':'), so every mount goes into the
    --conf script's mounts(), as pyxis writes them: fstab lines with \\040 for a space, the rank's
    directories first and the user's after (on top), tmpfs with its options, umount as x-detach."""
    from tether.container.runtimes.enroot import fstab_line

    sqsh = tmp_path / "img.sqsh"
    sqsh.write_bytes(b"hsqs")
    rank_dir = tmp_path / "42/n2/step-0/rank-3"
    mounts = parse_mounts("/tmp/a dir:/mnt/my mount:ro+unbindable,tmpfs:/scratch:size=1G+huge=within_size,"
                          "umount:/root,/etc/hosts:/h:x-create=file,/back\\slash:/b")
    launch = adapter("enroot", {"store": ""}).launch(
        spec(image=str(sqsh), runtime="enroot", rank_dir=str(rank_dir), mounts=mounts), HOST)
    assert "--mount" not in launch.argv
    lines = conf_printed(launch.argv[launch.argv.index("--conf") + 1], "mounts")
    assert len(lines) == 7
    assert lines == [
        f"{rank_dir}/tmp /tmp none x-create=dir,bind",
        f"{rank_dir}/work /run/tether/workdir none x-create=dir,bind",
        "/tmp/a\\040dir /mnt/my\\040mount none x-create=auto,rbind,ro,unbindable",
        "tmpfs /scratch tmpfs x-create=dir,size=1G,huge=within_size",
        "umount /root none x-detach",
        "/etc/hosts /h none x-create=file,rbind",
        "/back\\134slash /b none x-create=auto,rbind"]
    assert fstab_line(Mount("/a b", "/c")) == "/a\\040b /c none x-create=auto,rbind"


def test_tether_run_mounts_a_relative_source_with_spaces_through_enroot(tmp_path, fake_runtimes, runtime_config):
    """End to end with the strict enroot fake: a relative source from the task's working directory,
    spaces on both sides, reach enroot's fstab decoded; a missing relative source is refused
    before enroot runs, naming where tether looked."""
    work = tmp_path / "job dir"
    (work / "in put").mkdir(parents=True)
    sqsh = tmp_path / "img.sqsh"
    sqsh.write_bytes(b"hsqs")
    common = ["--container-runtime=enroot", f"--container-image={sqsh}"]
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, *common,
                       "--container-mounts=./in put:/my data:ro,tmpfs:/scratch:huge=within_size",
                       "--container-workdir=my data", "--", "true", cwd=str(work))
    assert proc.returncode == 0, proc.stderr
    (started,) = fake_runtimes.calls("enroot-container")
    assert [str(work / "in put"), "/my data", "none", "x-create=auto,rbind,ro"] in started["fstab"]
    assert ["tmpfs", "/scratch", "tmpfs", "x-create=dir,huge=within_size"] in started["fstab"]
    assert started["command"][-3:] == ["sh", "/my data", "true"]          # relative: from the root
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, *common, "--container-mounts=./nope:/n",
                       "--", "true", cwd=str(work))
    assert (proc.returncode, proc.stderr) == (
        125, f"tether: --container-mounts: {work}/nope: source path does not exist on this node\n")


def test_the_workdir_follows_pyxis_relative_from_the_root_and_never_above_it(tmp_path):
    """pyxis changes to --container-workdir inside the container: relative from the root, '..'
    at the root stays there, blanks allowed; a directory the image lacks is not made (pyxis: "No
    such file or directory"; podman refuses a missing --workdir, enroot's cd fails)."""
    env = {**HOST, "TETHER_CONTAINER_IMAGE": "/i"}

    def workdir(value: str) -> str:
        return spec_from_env({**env, "TETHER_CONTAINER_WORKDIR": value}, ["true"], default_runtime="podman").workdir

    assert [workdir(v) for v in ("/usr/local/bin", "../", "work/x", "./a b/", "/a/../../b")] == [
        "/usr/local/bin", "/", "/work/x", "/a b", "/b"]
    check_container_options({"container-image": "/i", "container-workdir": "rel dir"}, "podman")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    argv = adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman", workdir="/a b"), HOST).argv
    assert ["--workdir", "/a b"] in _pairs(argv)
    from tether.container.runtimes.enroot import CD_PROLOGUE

    # no mkdir: a missing one fails, as pyxis, in its words (enroot's /bin/sh says only "can't cd")
    missing = subprocess.run(["/bin/sh", "-c", CD_PROLOGUE, "sh", str(tmp_path / "pyxis"), "pwd"],
                             capture_output=True, text=True)
    assert (missing.returncode, missing.stdout) == (125, "")
    assert missing.stderr == f"tether: --container-workdir: couldn't chdir to {tmp_path}/pyxis: No such file or directory\n"
    there = subprocess.run(["/bin/sh", "-c", CD_PROLOGUE, "sh", str(rootfs), "pwd"], capture_output=True, text=True)
    assert (there.returncode, there.stdout, there.stderr) == (0, f"{rootfs}\n", "")
