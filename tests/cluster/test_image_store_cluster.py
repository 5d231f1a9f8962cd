"""The cluster image store on the sandbox (issue 44): the image service on every node as an admin
runs it, the store in the sandbox's shared directory, real rootless podman, the sandbox's real
registry (its access log counts what was fetched), squashfuse mounts in each user's namespace."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import time

import pytest
import yaml

from tether.container.imagestore import ImageStore
from tether.job_submit.handler import CONFIG_CHECK_SECONDS
from tether.testing.runtimes import FakeRuntimes


@pytest.fixture(scope="module")
def cluster_store(cluster):
    """The sandbox with container.cluster_store and the nodes' image services (Sandbox.cluster_store_on)."""
    with cluster.box.cluster_store_on() as root:
        yield ImageStore(root, pwd.getpwnam(cluster.box.cluster_store_settings()["account"]).pw_uid)


def _fakes(box, name: str) -> FakeRuntimes:
    """The testing kit's fake runtimes in the sandbox's directory ``name``, for every node's job
    users, without an earlier session's calls; exit 0."""
    fakes = FakeRuntimes(box.root / name, python=box.python)
    for path in (fakes.root, fakes.bin_dir):
        os.chmod(path, 0o755)
    for left in ("calls.jsonl", "behaviour.json"):             # an earlier session's
        (fakes.state_dir / left).unlink(missing_ok=True)
    fakes.configure(exit_code=0)
    return fakes


@contextlib.contextmanager
def _binary(box, runtime: str, fakes: FakeRuntimes):
    """The sandbox's config with ``runtime``'s binary the fake's, for the time of a ``with``."""
    conf = box.tether_conf
    original = conf.read_text()
    data = yaml.safe_load(original)
    data["container"][runtime] = {**data["container"].get(runtime, {}), "binary": str(fakes.bin_dir / runtime)}
    conf.write_text(yaml.safe_dump(data))
    time.sleep(CONFIG_CHECK_SECONDS + 0.05)
    try:
        yield
    finally:
        conf.write_text(original)


def fetches(requests: list[str], repository: str) -> dict[str, int]:
    """GET requests of the registry's access log per path, of this repository."""
    out: dict[str, int] = {}
    for line in requests:
        if '"GET ' in line and f"/v2/{repository}/" in line:
            path = line.split('"GET ', 1)[1].split()[0]
            out[path] = out.get(path, 0) + 1
    return out


# the rank's root: its mountinfo line names squashfuse (as the fstype's subtype or the source)
SHOW = ["sh", "-c", "echo $(hostname) $(id -un) $STORE_TEST "
                    "$(awk '$5 == \"/\"' /proc/self/mountinfo | grep -o squashfuse | head -n 1)"]


def test_two_users_jobs_on_every_node_cost_the_registry_one_manifest_and_each_layer_once(cluster, cluster_store):
    """A cold image, a 3-node job of one user and then of a second user who never ran anything:
    one service on one node fetches it (the others wait, and say who fetches), every rank starts
    from the same read-only squashfs, mounted in its user's namespace (nothing unpacked, nothing in
    the users' own stores), with the image's ENV; the registry sees one manifest request and one
    request for each blob in all."""
    box = cluster.box
    repository = f"tether/store-{os.getpid()}"
    ref = box.registry_image(repository=repository, changes=("ENV STORE_TEST=from-image", "CMD /bin/sh"),
                             log=lambda *_: None)
    second = f"tether-st{os.getpid() % 100000}"
    box.add_job_user(second)
    try:
        before = len(box.registry_access_log())
        first = cluster.as_user(["srun", "-N3", "--ntasks-per-node=2", f"--container-image={ref}", *SHOW])
        other = cluster.run(["runuser", "-u", second, "--", "srun", "-N3", f"--container-image={ref}", *SHOW])
        fetched = fetches(box.registry_access_log()[before:], repository)
        assert sorted(first.stdout.split("\n")[:-1]) == sorted(
            f"{n} {cluster.user} from-image squashfuse" for n in cluster.nodes for _ in range(2)), first.stderr
        assert sorted(other.stdout.split("\n")[:-1]) == [f"{n} {second} from-image squashfuse"
                                                          for n in cluster.nodes], other.stderr
        assert first.stderr.count("into the cluster image store (once for the whole cluster)") == 1, first.stderr
        assert "is fetching it" in first.stderr or first.stderr.count("tether:") <= 2, first.stderr
        assert "tether:" not in other.stderr, other.stderr
        manifests = [p for p in fetched if "/manifests/" in p]
        blobs = [p for p in fetched if "/blobs/" in p]
        assert manifests == [f"/v2/{repository}/manifests/1"] and fetched[manifests[0]] == 1, fetched
        assert len(blobs) >= 2 and all(fetched[b] == 1 for b in blobs), fetched      # config and layer
        # the store holds it once; both users are its users; neither user's own store has it
        [info] = [i for i in cluster_store.images() if ref in i.references]
        uids = {pwd.getpwnam(u).pw_uid for u in (cluster.user, second)}
        assert set(info.users) == uids
        for node in cluster.nodes:
            for uid in uids:
                store = box.node_path(node, f"{box.store_base}/{uid}/podman/storage")
                for images in store.glob("*-images/images.json"):
                    assert repository not in images.read_text(), (node, images)
        shown = cluster.run([*box.tether, "images", "ls", "--runtime", "podman", "--config", str(box.tether_conf)])
        assert any(line.startswith("cluster ") and ref in line and cluster.user in line and second in line
                   for line in shown.stdout.splitlines()), shown.stdout
    finally:
        box.remove_job_user(second)


def test_no_user_can_change_what_another_runs(cluster, cluster_store):
    """The store's files are its account's: a job user can neither plant an image nor point a
    reference elsewhere, and a rank refuses a store someone else could change."""
    root = cluster_store.root
    for path in ("images/planted.sqfs", "refs/planted.json", "planted"):
        tried = cluster.as_user(["sh", "-c", f"echo x > {root}/{path}"], check=False)
        assert tried.returncode != 0 and "Permission denied" in tried.stderr, (path, tried.stderr)
    listing = json.dumps(sorted(os.listdir(os.path.join(root, "images"))))
    assert "planted" not in listing


def test_a_private_image_never_enters_the_store_and_a_missing_one_fails_every_rank_clearly(cluster, cluster_store):
    """An image that needs credentials is fetched by each user with their own login, as without a
    cluster store (the service fetches nothing with anyone's credentials); one the registry lacks
    fails each rank with the registry's words, and nothing is published."""
    box = cluster.box
    private = box.private_registry_image(log=lambda *_: None)
    denied = cluster.as_user(["srun", "-N1", f"--container-image={private}", "true"], check=False)
    assert denied.returncode != 0 and "authentication required" in denied.stderr, denied.stderr
    assert "tether: pulling " in denied.stderr                     # the user's own pull, refused
    assert not [i for i in cluster_store.images() if private in i.references]
    assert cluster_store.private(private, None)
    missing = f"{box.registry_address}/tether/absent-{os.getpid()}:1"
    failed = cluster.as_user(["srun", "-N3", f"--container-image={missing}", "true"], check=False)
    assert failed.returncode != 0 and failed.stderr.count("manifest unknown") >= 3, failed.stderr
    assert cluster_store.lookup(missing, max_age=None) is None
    assert not os.listdir(os.path.join(cluster_store.root, "staging"))


def test_mounts_onto_targets_the_image_lacks_and_a_writable_container(cluster, cluster_store):
    """A store image has no /data and no /home: a --container-mounts target or the home mounted
    there is made in podman's overlay over the image (the root still read-only); a writable
    container is the user's own copy, from their own store, theirs to write in."""
    box = cluster.box
    ref = box.registry_image(repository=f"tether/store-m{os.getpid()}", changes=("CMD /bin/sh",), log=lambda *_: None)
    src = box.work_dir / f"store-mnt-{os.getpid()}"
    src.mkdir(exist_ok=True)
    os.chmod(src, 0o777)
    (src / "seen").write_text("yes\n")
    mounted = cluster.as_user(["srun", "-N1", f"--container-image={ref}", f"--container-mounts={src}:/data",
                               "--container-mount-home", "sh", "-c",
                               "cat /data/seen; test -d $HOME && echo home; touch /x 2>&1 || true"])
    assert mounted.stdout.split("\n")[:2] == ["yes", "home"], mounted.stderr
    assert "Read-only file system" in mounted.stdout, mounted.stdout
    assert "into the cluster image store" in mounted.stderr                   # from the store
    writable = cluster.as_user(["srun", "-N1", f"--container-image={ref}", "--container-writable", "sh", "-c",
                                "touch /newfile && echo wrote"])
    assert writable.stdout.strip() == "wrote", writable.stderr
    assert f"pulling {ref} (podman)" in writable.stderr                       # the user's own copy


def test_an_enroot_rank_starts_the_stores_squashfs_as_it_is(cluster, cluster_store):
    """enroot ranks use the same store: each starts the store's squashfs itself (enroot start FILE:
    squashfuse under a discarded overlay, nothing imported or unpacked, nothing in the user's own
    store), with the image's ENV (what the fake computes the program would see, by enroot's rules);
    enroot is the testing kit's strict fake (it checks squashfuse,
    fuse-overlayfs and /dev/fuse as the user, and leaves the stopped fuse shim enroot leaves),
    run by the real SPANK plugin and launcher on every node, the image fetched by the real
    service's podman. The shim is hung up by the launcher: no stopped process of the user stays."""
    box = cluster.box
    fakes = _fakes(box, "fake-runtimes-store")
    ref = box.registry_image(repository=f"tether/store-e{os.getpid()}", changes=("ENV STORE_TEST=from-image",
                                                                                  "CMD /bin/sh"), log=lambda *_: None)
    with _binary(box, "enroot", fakes):
        ran = cluster.as_user(["srun", "-N3", "--container-runtime=enroot", f"--container-image={ref}", "true"])
        assert ran.returncode == 0, ran.stderr
        [published] = [i for i in cluster_store.images() if ref in i.references]
        image = os.path.join(cluster_store.root, "images", f"{published.image_id}.sqfs")
        assert [c["argv"][1] for c in fakes.calls("enroot")] == ["start"] * 3      # no import, no create
        started = fakes.calls("enroot-container")
        assert [c["container"] for c in started] == [image] * 3
        assert [c["container_env"].get("STORE_TEST") for c in started] == ["from-image"] * 3
        stopped = cluster.run(["ps", "-u", cluster.user, "-o", "pid=,stat=,args="], check=False).stdout
        assert not [line for line in stopped.splitlines() if line.split()[1].startswith("T")], stopped


def test_a_registry_gone_mid_pull_fails_every_rank_clearly_and_the_next_job_fetches_it(cluster, cluster_store):
    """The registry killed while the service pulls a 512 MiB layer (right after it served the
    manifest): every rank says the store's fetch failed in the pull's words and tries the user's
    own pull (which fails too: the registry is gone), nothing is published or left
    in staging, the lock is gone; with the registry back, the next job fetches and runs it."""
    import subprocess

    box = cluster.box
    repository = f"tether/store-gone{os.getpid()}"
    ref = box.registry_image(repository=repository, rootfs=box.large_image(0.5), log=lambda *_: None)
    before = len(box.registry_access_log())
    job = subprocess.Popen(box.wrap(["runuser", "-u", cluster.user, "--", "srun", "-N2", f"--container-image={ref}",
                                     "true"], str(box.work_dir)),       # in the Slurm root, if any
                           env=box.command_env(), cwd=str(box.work_dir), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not any("/manifests/" in line for line in fetches(box.registry_access_log()[before:], repository)):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.02)
        with box.registry_gone():
            out, err = job.communicate(timeout=600)
            assert job.returncode != 0, err
            # the service's words, then the user's own pull (the registry is gone for it too)
            assert err.count(f"the cluster image store could not fetch {ref} (pulling {ref} failed") >= 1, err
            assert err.count("pulling it into your own store") == 2, err                # each rank
            assert cluster_store.lookup(ref, max_age=None) is None
            assert not os.listdir(os.path.join(cluster_store.root, "staging"))
            assert cluster_store.publisher(ref) is None
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    again = cluster.as_user(["srun", "-N2", f"--container-image={ref}", "sh", "-c", "ls /data | wc -l"])
    assert again.stdout.split() == ["8", "8"], again.stderr
    assert cluster_store.lookup(ref, max_age=None) is not None


def test_two_users_jobs_racing_on_a_new_image_cost_one_fetch(cluster, cluster_store):
    """Two jobs of two users started at once on an image nobody fetched: one fetch for both
    (the registry's access log), both jobs' ranks run it, no failure or second copy."""
    import subprocess

    box = cluster.box
    repository = f"tether/store-race{os.getpid()}"
    ref = box.registry_image(repository=repository, changes=("CMD /bin/sh",), log=lambda *_: None)
    second = f"tether-sr{os.getpid() % 100000}"
    box.add_job_user(second)
    try:
        before = len(box.registry_access_log())
        jobs = [subprocess.Popen(box.wrap(["runuser", "-u", user, "--", "srun", "-N3", f"--container-image={ref}",
                                           "sh", "-c", "id -un"], str(box.work_dir)),
                                 env=box.command_env(), cwd=str(box.work_dir), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
                for user in (cluster.user, second)]
        done = [job.communicate(timeout=600) for job in jobs]
        for job, (out, err), user in zip(jobs, done, (cluster.user, second)):
            assert job.returncode == 0 and out.split() == [user] * 3, err
        fetched = fetches(box.registry_access_log()[before:], repository)
        assert [fetched[p] for p in fetched if "/manifests/" in p] == [1], fetched
        assert all(fetched[p] == 1 for p in fetched if "/blobs/" in p), fetched
        assert len([i for i in cluster_store.images() if ref in i.references]) == 1
        assert sum("into the cluster image store (once for the whole cluster)" in err for _, err in done) == 1, done
    finally:
        box.remove_job_user(second)


def test_an_apptainer_rank_starts_the_stores_apptainer_form(cluster, cluster_store):
    """Apptainer ranks use the same store: the service writes, with the image, its Apptainer form
    (a gzip squashfs with the image's ENV in /.singularity.d: Apptainer before 1.4 reads no zstd),
    and every rank hands that file to apptainer exec as it is (no build, nothing in the image
    cache). Apptainer is the testing kit's strict fake (it refuses a zstd squashfs as Apptainer
    1.1.9 did, and sources the form's env scripts as its action script does), run by the real
    SPANK plugin and launcher on every node; the form is made by the real service."""
    box = cluster.box
    fakes = _fakes(box, "fake-runtimes-store-a")
    fakes.configure(profiles={"apptainer": "apptainer-1"})
    ref = box.registry_image(repository=f"tether/store-a{os.getpid()}", changes=("ENV STORE_TEST=from-image",
                                                                                  "CMD /bin/sh"), log=lambda *_: None)
    with _binary(box, "apptainer", fakes):
        ran = cluster.as_user(["srun", "-N3", "--container-runtime=apptainer", f"--container-image={ref}", "true"])
        assert ran.returncode == 0, ran.stderr
        [published] = [i for i in cluster_store.images() if ref in i.references]
        form = os.path.join(cluster_store.root, "images", f"{published.image_id}.apptainer.sqfs")
        calls = fakes.calls("apptainer")
        assert [c["subcommand"] for c in calls] == ["exec"] * 3                    # no build
        assert [c["image"] for c in calls] == [form] * 3
        assert [c["container_env"].get("STORE_TEST") for c in calls] == ["from-image"] * 3
        assert "making the Apptainer image of" in ran.stderr or "is fetching it" in ran.stderr, ran.stderr
