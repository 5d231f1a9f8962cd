"""Container image references, parsed once: what a user may write for ``--container-image``.

Accepted (the SPANK plugin's C checks the same grammar, ``spank/options.c``; a test holds them
together):

* a path on the node: a SIF, a squashfs file, an OCI archive or a rootfs directory, absolute or
  relative to the step's working directory (``./ubuntu.sqsh``, ``../images/x.sif``: pyxis's), which
  the container launcher resolves there, on the node;
* a registry image as pyxis and enroot users write it, ``[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]``
  (``ubuntu:22.04``, ``nvcr.io#nvidia/pytorch:24.01-py3``), or as docker and podman users write
  it, ``REGISTRY/IMAGE[:TAG|@DIGEST]`` where REGISTRY has a ``.`` or a ``:port`` or is
  ``localhost`` (``127.0.0.1:5000/team/app:1.0``);
* either of those after ``docker://``; and the URIs Apptainer converts (``oras://``,
  ``library://``, ``shub://``, ``docker-archive:``, ``oci-archive:``), passed on as written.

Each runtime gets the spelling it understands (``docker_uri``, ``enroot_uri``). No ``re`` here: the
container launcher parses its image once per rank.
"""

from __future__ import annotations

FORMS = ("a path (a .sif or squashfs file, a rootfs directory: absolute, or ./ relative to the working directory), "
         "a registry image "
         "([USER@][REGISTRY#]IMAGE[:TAG|@DIGEST], e.g. ubuntu:22.04 or nvcr.io#nvidia/pytorch:24.01-py3; "
         "or REGISTRY/IMAGE[:TAG]) or a docker:// reference")
DEFAULT_REGISTRY = "docker.io"
OTHER_SCHEMES = ("oras://", "library://", "shub://", "docker-archive:", "oci-archive:")
MAX_REFERENCE = 4096
LOCAL_SUFFIXES = (".sif", ".sqsh", ".squashfs")     # a file, even where a registry name could look so
LOCAL_PREFIXES = ("/", "./", "../")                  # a path: absolute, or relative to the working directory

_LOWER = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ") | _LOWER
_HEX = frozenset("0123456789abcdef")
# the characters each part may have (set(text) <= ...: one C-level pass, not a generator per char)
_COMPONENT_CHARS = _LOWER | frozenset("._-")
_HOST_CHARS = _ALNUM | frozenset(".-")
_TAG_CHARS = _ALNUM | frozenset("_.-")


class ImageRefError(ValueError):
    """A reference that is none of the accepted forms (the message names them)."""


class ImageRef:
    """A parsed reference: ``local`` (a path), ``registry`` (registry, repository, tag, digest,
    user) or ``uri`` (another scheme, passed on as written)."""

    __slots__ = ("text", "kind", "path", "registry", "repository", "tag", "digest", "user", "uri")

    def __init__(self, text: str, kind: str, *, path: str | None = None, registry: str | None = None,
                 repository: str | None = None, tag: str | None = None, digest: str | None = None,
                 user: str | None = None, uri: str | None = None):
        self.text, self.kind, self.path, self.uri = text, kind, path, uri
        self.registry, self.repository, self.tag, self.digest, self.user = registry, repository, tag, digest, user

    @property
    def remote(self) -> bool:
        return self.kind != "local"

    def _name(self) -> str:
        assert self.repository is not None
        registry = self.registry or DEFAULT_REGISTRY
        repository = self.repository
        if registry == DEFAULT_REGISTRY and "/" not in repository:
            repository = "library/" + repository             # docker hub's official images
        return f"{registry}/{repository}"

    def _suffix(self, default_tag: str = "latest") -> str:
        tag = self.tag or (None if self.digest else default_tag)
        return (f":{tag}" if tag else "") + (f"@{self.digest}" if self.digest else "")

    def docker_uri(self) -> str:
        """``docker://REGISTRY/REPOSITORY:TAG`` (podman, Apptainer, Singularity), spelled out in full
        (docker.io, library/, :latest) so that one image has one spelling; other URIs as written."""
        if self.kind == "uri":
            return self.uri or self.text
        if self.kind == "local":
            raise ImageRefError(f"{self.text} is a local image")
        return f"docker://{self._name()}{self._suffix()}"

    def qualified(self) -> str:
        """``REGISTRY/REPOSITORY:TAG`` in full: the name podman stores a pulled image under."""
        return self.docker_uri()[len("docker://"):]

    def enroot_uri(self) -> str:
        """enroot's spelling: ``docker://[USER@][REGISTRY#]IMAGE[:TAG]``."""
        if self.kind != "registry":
            raise ImageRefError(f"{self.text}: enroot imports docker:// images or runs a squashfs file")
        user = f"{self.user}@" if self.user else ""
        registry = f"{self.registry}#" if self.registry else ""
        return f"docker://{user}{registry}{self.repository}{self._suffix('')}"

    def __repr__(self) -> str:
        return f"ImageRef({self.text!r}, {self.kind})"


def _component(text: str) -> bool:
    """A repository path component: lowercase letters and digits, separated by '.', '_' or '-'."""
    return bool(text) and text[0] in _LOWER and text[-1] in _LOWER and set(text) <= _COMPONENT_CHARS


def _repository(text: str) -> bool:
    return all(_component(part) for part in text.split("/"))


def _registry(text: str) -> bool:
    """host[:port]: letters, digits, '.', '-' (starting with a letter or digit), a numeric port."""
    host, colon, port = text.partition(":")
    if not host or host[0] not in _ALNUM or not set(host) <= _HOST_CHARS:
        return False
    return not colon or (port.isascii() and port.isdigit() and len(port) <= 5)


def _tag(text: str) -> bool:
    return 0 < len(text) <= 128 and (text[0] in _ALNUM or text[0] == "_") and set(text) <= _TAG_CHARS


def _digest(text: str) -> bool:
    algorithm, colon, hexpart = text.partition(":")
    return bool(algorithm) and set(algorithm) <= _LOWER and bool(colon) and len(hexpart) >= 32 and \
        set(hexpart) <= _HEX


def _looks_like_registry(first: str) -> bool:
    return "." in first or ":" in first or first == "localhost"


def _parse_name(text: str, original: str) -> ImageRef | None:
    """``[USER@][REGISTRY#]IMAGE[:TAG][@DIGEST]`` or ``REGISTRY/IMAGE[:TAG][@DIGEST]``; None if not."""
    user = None
    rest = text
    digest = None
    if "@" in rest:                                   # user@... or ...@digest (or both)
        head, _, tail = rest.rpartition("@")
        if _digest(tail):
            rest, digest = head, tail
        if "@" in rest:
            user, _, rest = rest.partition("@")
            if not user or not set(user) <= _TAG_CHARS:
                return None
    registry = None
    if "#" in rest:
        registry, _, rest = rest.partition("#")
        if not _registry(registry):
            return None
    elif "/" in rest and _looks_like_registry(rest.split("/", 1)[0]):
        registry, _, rest = rest.partition("/")
        if not _registry(registry) or user is not None:
            return None
    repository, colon, tag = rest.partition(":")
    if colon and not _tag(tag):
        return None
    if not _repository(repository) or repository.endswith(LOCAL_SUFFIXES):
        return None                                   # img.sif is a file meant, not a registry image
    return ImageRef(original, "registry", registry=registry, repository=repository, tag=tag or None,
                    digest=digest, user=user)


_last: tuple[str, ImageRef] | None = None     # the last reference parsed, and what it is


def parse_image(text: str) -> ImageRef:
    """The reference ``text`` parsed (ImageRefError, naming the accepted forms, when it is none).
    The last one is kept: slurmctld's job_submit handler checks a request's image, then the
    container options' check parses it again."""
    global _last
    last = _last
    if last is not None and last[0] == text:
        return last[1]
    ref = _parse(text)
    _last = (text, ref)
    return ref


def _parse(text: str) -> ImageRef:
    if not text or len(text.encode("utf-8", "surrogateescape")) > MAX_REFERENCE:
        raise ImageRefError(f"--container-image={text[:60]}: expected {FORMS}")
    if text.startswith(LOCAL_PREFIXES):
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
            raise ImageRefError(f"--container-image={text[:60]!r}: a path of printable characters")
        return ImageRef(text, "local", path=text)
    if text.startswith(OTHER_SCHEMES):
        if all(0x21 <= ord(c) <= 0x7E for c in text) and not text.endswith((":", "//")):
            return ImageRef(text, "uri", uri=text)
    else:
        ref = _parse_name(text[len("docker://"):] if text.startswith("docker://") else text, text)
        if ref is not None:
            return ref
    hint = ""
    if text.endswith((*LOCAL_SUFFIXES, ".img")):
        hint = " (a local image: its path, absolute or starting with ./)"
    elif any(c.isupper() for c in text.split(":")[0].split("#")[-1].split("/")[-1]):
        hint = " (image names are lowercase)"
    raise ImageRefError(f"--container-image={text[:60]}: expected {FORMS}{hint}")


def valid_reference(text: str) -> bool:
    """Whether ``text`` is an accepted reference (the check the SPANK plugin's C makes)."""
    try:
        parse_image(text)
    except ImageRefError:
        return False
    return True
