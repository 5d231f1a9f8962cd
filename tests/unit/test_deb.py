"""tether's Debian package (`make deb`, tools/deb.py): built once per session, its control fields and
files checked, then installed, removed and purged with dpkg into a scratch root -- never into this
host's own /usr, /etc or dpkg database."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tether.admin.slurm import plugstack_line, spank_lines
from tether.hooks.config import default_config
from tether.admin.slurm import install_plugins, sources_digest
from tether.hooks.configfile import load_config
from tether.system.toolchain import PACKAGED_BUILD_STAMP, BuildError, installed_slurm_version, system_plugin_dir

from helpers import REPO, make_config

DROPIN = "etc/slurm/plugstack.conf.d/tether.conf"


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> dict:
    """The wheel and the .deb, built once from this checkout (about 20 s) into a scratch dist/."""
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run([sys.executable, str(REPO / "tools" / "deb.py"), "--out", str(out),
                             "--wheel-python", sys.executable, "--version", "0.1.0-1"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    wheel, deb = (Path(line) for line in result.stdout.split())
    fields = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    files = {line.split()[5].removeprefix(".") for line in listing.splitlines() if not line.startswith("d")}
    return {"wheel": wheel, "deb": deb, "control": dict(re.findall(r"^(\S+): (.*)$", fields, re.M)), "files": files,
            "listing": listing}


def test_the_package_is_named_for_its_slurm_and_depends_on_that_exact_release(built):
    slurm = installed_slurm_version()
    assert slurm, "the package's tests need the host's Slurm (libslurm-dev, slurm-client)"
    major, minor, micro = slurm.split(".")
    control = built["control"]
    assert control["Package"] == f"tether-slurm{major}.{minor}"
    assert built["deb"].name == f"tether-slurm{major}.{minor}_0.1.0-1_{control['Architecture']}.deb"
    assert (control["Provides"], control["Conflicts"], control["Replaces"]) == ("tether",) * 3
    depends = [d.strip() for d in control["Depends"].split(",")]
    library = subprocess.run(["dpkg-query", "-S", str(Path(next(Path("/usr/lib").glob("*/libslurm.so"))).resolve())],
                             capture_output=True, text=True, check=True).stdout.split(":")[0]
    assert f"{library} (>= {slurm})" in depends and f"{library} (<< {major}.{minor}.{int(micro) + 1}~)" in depends
    for needed in ("python3-cffi-backend", "python3-yaml", "python3-jinja2", "python3 (>= 3.11)"):
        assert needed in depends
    assert any(d.startswith("libpython3.11 ") for d in depends)         # dpkg-shlibdeps: the embedded libpython
    assert control["Recommends"] == "python3-aiohttp"
    assert control["Section"] == "admin" and control["Maintainer"]


def test_the_package_holds_the_plugins_the_launcher_the_python_part_and_the_docs(built):
    plugin_dir = system_plugin_dir()
    expected = {f"{plugin_dir}/{n}" for n in ("spank_tether.so", "job_submit_tether.so", "tether-run", "tether-run-py",
                                                      "tether-fd-receive")}
    expected |= {"/usr/bin/tether", "/" + DROPIN, "/lib/systemd/system/tether-serve.service",
                 "/usr/share/man/man1/tether.1.gz", "/usr/share/man/man5/tether.yaml.5.gz",
                 "/usr/share/man/man8/tether-spank.8.gz", "/usr/lib/python3/dist-packages/tether/cli/main.py",
                 "/usr/lib/python3/dist-packages/tether/job_submit/handler.py", PACKAGED_BUILD_STAMP}
    # the C a host rebuilds from (`tether slurm build`, `tether pbs install --apply`), the shared units too
    expected |= {f"/usr/lib/python3/dist-packages/tether/{p.relative_to(REPO)}"
                 for folder in ("native", "spank", "job_submit", "pbs_hooks") for p in (REPO / folder).glob("*.[ch]")}
    package = built["control"]["Package"]
    expected |= {f"/usr/share/doc/{package}/{n}" for n in ("copyright", "changelog.Debian.gz", "examples/tether.yaml")}
    assert expected <= built["files"], expected - built["files"]
    # nothing built on the way, nothing of the checkout's, nothing in /etc but the drop-in
    strays = [f for f in built["files"] if f.endswith((".pyc", ".o", "/build.json", "/RECORD")) or "__pycache__" in f]
    assert not strays
    assert [f for f in built["files"] if f.startswith("/etc/")] == ["/" + DROPIN]
    assert not [f for f in built["files"] if f.startswith(("/usr/local", "/opt", "/var"))]
    for line in built["listing"].splitlines():              # root-owned, nothing writable by others
        mode, owner = line.split()[:2]
        assert owner == "root/root" and mode[5] != "w" and mode[8] != "w", line
    assert "tether-0.1.0-py3-none-any.whl" == built["wheel"].name


def test_the_plugins_embed_debians_python_not_the_build_tree(built, tmp_path):
    subprocess.run(["dpkg-deb", "-x", str(built["deb"]), str(tmp_path)], check=True)
    plugin_dir = tmp_path / system_plugin_dir().lstrip("/")
    job_submit = (plugin_dir / "job_submit_tether.so").read_bytes()
    assert b"/usr/lib/python3/dist-packages" in job_submit and b"/usr/lib/python3.11" in job_submit
    for leaked in (str(tmp_path), str(REPO), "tether-deb-", "/opt/tether", sys.prefix):
        assert leaked.encode() not in job_submit, leaked
        assert leaked.encode() not in (plugin_dir / "tether-run").read_bytes(), leaked
    python_launcher = (plugin_dir / "tether-run-py").read_text()
    assert python_launcher.startswith("#!/usr/bin/python3 -IS\n")
    assert "sys.path[:0] = ['/usr/lib/python3/dist-packages']" in python_launcher
    assert "handoff('/etc/tether/tether.yaml', None, " in python_launcher      # not this host's config file
    assert (tmp_path / "usr/bin/tether").read_text().startswith("#!/usr/bin/python3\n")
    dropin = (tmp_path / DROPIN).read_text()
    line = plugstack_line(Path(system_plugin_dir()), default_config())
    assert f"\n#{line}\n" in dropin                          # the line for the defaults, inactive
    assert not spank_lines(tmp_path / DROPIN)
    unit = (tmp_path / "lib/systemd/system/tether-serve.service").read_text()
    assert "ExecStart=/usr/bin/tether serve\n" in unit and "User=tether-launcher\n" in unit
    assert "StandardError=" not in unit and "StandardOutput=" not in unit      # stderr: the journal


def scratch_root(path: Path, depends: str) -> Path:
    """A root for dpkg --root: an empty database in which the packages the .deb depends on are
    recorded installed (their stanzas copied from this host's database: dpkg checks the Depends
    against them, so no --force-depends; their files are not there, and nothing needs them)."""
    admin = path / "var/lib/dpkg"
    for sub in ("info", "updates", "triggers"):
        (admin / sub).mkdir(parents=True)
    names = {re.split(r"[\s(:]", d.strip())[0] for d in depends.split(",")}
    stanzas = subprocess.run(["dpkg-query", "-s", *sorted(names)], capture_output=True, text=True, check=True).stdout
    (admin / "status").write_text(stanzas.rstrip("\n") + "\n\n")
    (path / "etc/slurm").mkdir(parents=True)
    return path


def dpkg(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    # --force-script-chrootless: the maintainer scripts run without chroot (the scratch root has no
    # /bin/sh), with DPKG_ROOT set -- tools/debian's scripts prefix every path with it and never call
    # systemctl then. Only ever with --root to a scratch directory.
    return subprocess.run(["dpkg", f"--root={root}", "--force-script-chrootless", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def test_install_remove_purge_with_dpkg_keep_the_config_until_purge_and_leave_nothing(built, tmp_path):
    root = scratch_root(tmp_path / "root", built["control"]["Depends"])
    before = sorted(p for p in root.rglob("*") if "var/lib/dpkg" not in str(p))
    package = built["control"]["Package"]
    installed = dpkg(root, "-i", str(built["deb"]))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "dependency problems" not in installed.stderr
    status = dpkg(root, "-s", package)
    assert "Status: install ok installed" in status.stdout
    for path in built["files"]:
        assert (root / path.lstrip("/")).is_file(), path
    compiled = list((root / "usr/lib/python3/dist-packages/tether").rglob("*.pyc"))
    assert compiled                                          # the postinst byte-compiled them
    # the admin's config and an active SPANK line (what the README tells them to do)
    (root / "etc/tether").mkdir()
    (root / "etc/tether/tether.yaml").write_text("job_storage_root: /srv/tether/jobs\n")
    dropin = root / DROPIN
    dropin.write_text(dropin.read_text().replace("\n#required ", "\nrequired "))
    refused = dpkg(root, "-r", package)                      # Slurm would still load it: refused
    assert refused.returncode != 0 and f"Slurm still loads tether: {dropin}" in refused.stderr, refused.stderr
    assert re.search(r"^Status: \w+ ok installed$", dpkg(root, "-s", package).stdout, re.M)   # still installed
    assert (root / system_plugin_dir().lstrip("/") / "spank_tether.so").is_file()
    (root / "etc/slurm/slurm.conf").write_text("ClusterName=x\nJobSubmitPlugins=lua,tether\n")
    dropin.write_text(dropin.read_text().replace("\nrequired ", "\n#required "))
    refused = dpkg(root, "-r", package)
    assert refused.returncode != 0 and "slurm.conf (JobSubmitPlugins)" in refused.stderr, refused.stderr
    (root / "etc/slurm/slurm.conf").write_text("ClusterName=x\nJobSubmitPlugins=lua\n")
    removed = dpkg(root, "-r", package)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "var/lib/dpkg" not in str(p))
    # the admin's config and the conffile stay on remove (dpkg's rule for conffiles)
    assert left == [DROPIN, "etc/slurm/slurm.conf", "etc/tether/tether.yaml"], left
    assert "Status: deinstall ok config-files" in dpkg(root, "-s", package).stdout
    purged = dpkg(root, "--purge", package)
    assert purged.returncode == 0, purged.stdout + purged.stderr
    after = sorted(p for p in root.rglob("*") if "var/lib/dpkg" not in str(p))
    assert set(after) == {*before, root / "etc/slurm/slurm.conf"}, after     # nothing of tether's is left
    assert not list((root / "var/lib/dpkg/info").glob(f"{package}.*"))
    assert package not in (root / "var/lib/dpkg/status").read_text()


def test_a_removal_in_favour_of_another_tether_or_forced_is_not_refused(built, tmp_path):
    """prerm refuses only a plain removal while Slurm loads tether: replacing the package by another
    tether-slurm (same paths) or TETHER_REMOVE_ANYWAY=1 go through."""
    root = scratch_root(tmp_path / "root", built["control"]["Depends"])
    package = built["control"]["Package"]
    assert dpkg(root, "-i", str(built["deb"])).returncode == 0
    (root / "etc/slurm/slurm.conf").write_text("JobSubmitPlugins=tether\n")
    prerm = root / "var/lib/dpkg/info" / f"{package}.prerm"
    env = {**os.environ, "DPKG_ROOT": str(root)}
    in_favour = subprocess.run(["sh", str(prerm), "remove", "in-favour", "tether-slurm23.02", "1"], env=env,
                               capture_output=True, text=True, timeout=60)
    assert in_favour.returncode == 0, in_favour.stderr
    assert subprocess.run(["sh", str(prerm), "remove"], env=env, capture_output=True,
                          timeout=60).returncode == 1
    forced = dpkg(root, "--purge", package, env={"TETHER_REMOVE_ANYWAY": "1"})
    assert forced.returncode == 0, forced.stderr
    assert not (root / "usr").exists()


def test_spank_lines_follow_plugstack_includes(tmp_path):
    """Debian's plugstack.conf is one `include /etc/slurm/plugstack.conf.d/*.conf` line: the doctor and
    `tether slurm install` find the package's drop-in through it, and only active lines."""
    conf_d = tmp_path / "plugstack.conf.d"
    conf_d.mkdir()
    (tmp_path / "plugstack.conf").write_text(f"optional other.so\ninclude {conf_d}/*.conf\n")
    (conf_d / "a.conf").write_text("#required /x/spank_tether.so job_storage_root=/a\n")
    assert spank_lines(tmp_path / "plugstack.conf") == []
    (conf_d / "tether.conf").write_text("required  /x/spank_tether.so job_storage_root=/b  # note\n")
    assert spank_lines(tmp_path / "plugstack.conf") == [(conf_d / "tether.conf",
                                                         "required /x/spank_tether.so job_storage_root=/b")]
    (tmp_path / "plugstack.conf").write_text("include plugstack.conf.d/*.conf\n")      # relative to its directory
    assert len(spank_lines(tmp_path / "plugstack.conf")) == 1


def test_slurm_install_on_a_package_host_writes_the_lines_for_the_packages_plugins(built, tmp_path):
    """With the package installed and no --build-dir, `tether slurm install` needs no build of its own
    (the README's package steps): it names the package's plugins, copies nothing over dpkg's files,
    and --write writes the two lines for them."""
    root = scratch_root(tmp_path / "root", built["control"]["Depends"])
    assert dpkg(root, "-i", str(built["deb"])).returncode == 0
    stamp_file = root / PACKAGED_BUILD_STAMP.lstrip("/")
    stamp = json.loads(stamp_file.read_text())
    plugin_dir = system_plugin_dir()
    assert stamp["plugin_dir"] == plugin_dir and stamp["toolchain"]["slurm_version"] == installed_slurm_version()
    assert sorted(stamp["files"]) == ["job_submit_tether.so", "spank_tether.so"]
    assert "tether-deb-" not in stamp_file.read_text()                   # no path of the build's
    assert stamp["sources"] == sources_digest()                          # this tether's own sources
    conf, plugstack = tmp_path / "slurm.conf", tmp_path / "plugstack.conf"
    conf.write_text(f"ClusterName=x\nJobSubmitPlugins=lua\nPlugStackConfig={plugstack}\n")
    plugstack.write_text("required other.so\n")
    config = make_config(job_storage_root=str(tmp_path / "jobs"),
                         container={"apptainer_image_root": str(tmp_path / "images")})
    said: list[str] = []
    lines = install_plugins(slurm_conf=conf, config=config, package_stamp=str(stamp_file), log=said.append)
    spank = f"required {plugin_dir}/spank_tether.so job_storage_root={tmp_path / 'jobs'} launcher={plugin_dir}/tether-run"
    assert lines[0] == "JobSubmitPlugins=lua,tether" and lines[1].startswith(spank)
    assert f"{', '.join(stamp['files'])} are in {plugin_dir} (tether's Debian package), tether-run too" in said[0]
    assert "JobSubmitPlugins=lua\n" in conf.read_text() and not (tmp_path / "jobs").exists()
    said.clear()
    install_plugins(slurm_conf=conf, config=config, package_stamp=str(stamp_file), write=True, log=said.append)
    assert "JobSubmitPlugins=lua,tether\n" in conf.read_text()
    assert plugstack.read_text() == f"required other.so\n{lines[1]}\n"
    assert any("nothing to copy" in line for line in said) and not any(line.startswith("installed ") for line in said)
    assert (tmp_path / "jobs").is_dir()
    # with a config file: the launcher built for it, outside dpkg's files, and the line names it
    config_file = tmp_path / "tether.yaml"
    config_file.write_text(f"job_storage_root: {tmp_path / 'jobs'}\ncontainer: {{apptainer_image_root: {tmp_path / 'images'}}}\n")
    site_config = load_config(str(config_file))
    launchers = tmp_path / "launcher"
    said.clear()
    line = install_plugins(slurm_conf=conf, config=site_config, package_stamp=str(stamp_file),
                           package_launcher_dir=str(launchers), write=True, log=said.append)[1]
    assert f" launcher={launchers}/tether-run " in line and line.startswith(f"required {plugin_dir}/spank_tether.so ")
    assert plugstack.read_text() == f"required other.so\n{line}\n"
    assert (launchers / "tether-run").read_bytes()[:4] == b"\x7fELF"
    assert f"handoff({str(config_file)!r}" in (launchers / "tether-run-py").read_text()
    assert oct(launchers.stat().st_mode & 0o777) == "0o755" and any(f"for {config_file}" in m for m in said)
    os.chmod(launchers, 0o777)                                  # others could swap every user's launcher
    with pytest.raises(BuildError, match="must be a root-owned directory"):
        install_plugins(slurm_conf=conf, config=site_config, package_stamp=str(stamp_file),
                        package_launcher_dir=str(launchers), write=True, log=said.append)
    # a directory above it others may write to (not sticky): they could rename it away and put theirs
    above = tmp_path / "open"
    above.mkdir(mode=0o755)
    os.chmod(above, 0o777)
    with pytest.raises(BuildError, match=f"{above} must be a root-owned directory"):
        install_plugins(slurm_conf=conf, config=site_config, package_stamp=str(stamp_file),
                        package_launcher_dir=str(above / "deeper" / "launcher"), write=True, log=said.append)
    assert not (above / "deeper").exists()                     # checked before anything is made there
    os.chmod(above, 0o1777)                                     # sticky, as /tmp: fine
    install_plugins(slurm_conf=conf, config=site_config, package_stamp=str(stamp_file),
                    package_launcher_dir=str(above / "deeper" / "launcher"), write=True, log=said.append)
    # another tether than the package's (a venv's): its plugstack line may say what the package's
    # plugins do not understand -- refused, as a stale build of one's own is
    stamp_file.write_text(json.dumps({**stamp, "sources": "0" * 64}))
    with pytest.raises(BuildError, match="built from other sources than this tether's: use the package's own"):
        install_plugins(slurm_conf=conf, config=site_config, package_stamp=str(stamp_file), log=said.append)
    stamp_file.write_text(json.dumps(stamp))
    assert (above / "deeper" / "launcher" / "tether-run").is_file()
    assert oct((above / "deeper").stat().st_mode & 0o777) == "0o755"     # made 0755 whatever the umask
    link = tmp_path / "link"
    link.symlink_to(launchers)
    with pytest.raises(BuildError, match="not a link"):
        install_plugins(slurm_conf=conf, config=site_config, package_stamp=str(stamp_file),
                        package_launcher_dir=str(link), write=True, log=said.append)
    with pytest.raises(BuildError, match="--plugin-dir /elsewhere would name other files"):
        install_plugins(slurm_conf=conf, config=config, package_stamp=str(stamp_file), plugin_dir=Path("/elsewhere"))
    stamp_file.write_text(json.dumps({**stamp, "toolchain": {**stamp["toolchain"], "slurm_version": "21.08.1"}}))
    with pytest.raises(BuildError, match="built for Slurm 21.08.1 .* install tether's package built for this Slurm"):
        install_plugins(slurm_conf=conf, config=config, package_stamp=str(stamp_file))
