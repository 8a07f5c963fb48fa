"""A small Hugging Face Hub on 127.0.0.1 for tests: the HTTP endpoints huggingface_hub (and through it
timm) calls to create a repo, upload files (regular and LFS), and download them.

Endpoints, as the Hub serves them:

- ``POST /api/repos/create``: JSON {name, organization, visibility}; 409 if it exists.
- ``POST /api/validate-yaml``: README.md front matter must be a YAML mapping with a known license id.
- ``POST /api/models/{repo}/preupload/{rev}``: per file ``uploadMode`` 'lfs' (weights-like suffixes or
  > 10 MB, like the Hub's default .gitattributes) or 'regular', and the current ``oid``.
- ``POST /{repo}.git/info/lfs/objects/batch``: git-lfs batch API, 'basic' transfer to ``PUT /lfs/{oid}``
  (the body's sha256 must match the oid).
- ``POST /api/models/{repo}/commit/{rev}``: NDJSON (header, file, lfsFile, deletedFile lines).
- ``HEAD|GET /{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag`` (git blob sha1, or the sha256 for LFS
  with ``X-Linked-Etag``/``X-Linked-Size``), ``Range`` supported; errors carry ``X-Error-Code``
  (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo) as huggingface_hub expects.
- ``GET /api/models/{repo}[/revision/{rev}]`` (model_info), ``GET /api/models/{repo}/tree/{rev}[/{path}]``.

Auth: ``Authorization: Bearer <token>`` with tokens given at construction (token -> user name). Writes
need the namespace's user; private repos are visible to their owner only (401 RepoNotFound otherwise);
gated repos to any valid token (401 GatedRepo without). Every request is logged in ``requests``.
HTTP/1.0 (one request per connection), so a stopped server leaves no live connection behind.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

LFS_SUFFIXES = (".safetensors", ".bin", ".npz", ".npy", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".zip")
LFS_MIN_SIZE = 10 * 1024 * 1024
LICENSES = ("apache-2.0", "mit", "bsd-3-clause", "cc-by-4.0", "cc-by-nc-4.0", "openrail", "other")  # a few of the Hub's
_REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"


@dataclass(frozen=True)
class Blob:
    data: bytes
    lfs: bool

    @property
    def git_oid(self) -> str:  # git's blob id
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_oid


@dataclass
class Repo:
    owner: str
    private: bool = False
    gated: bool = False
    branches: dict[str, str] = field(default_factory=dict)  # name -> commit
    commits: dict[str, dict[str, Blob]] = field(default_factory=dict)  # commit -> {path: blob}

    def resolve(self, revision: str) -> str | None:
        if revision in self.branches:
            return self.branches[revision]
        matches = [c for c in self.commits if c.startswith(revision)] if len(revision) >= 7 else []
        return matches[0] if len(matches) == 1 else None


class HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


class FakeHub:
    """``FakeHub({token: user}).start()``; ``.url``; ``.stop()``. Also ``add_repo`` to seed repos written by
    other tools (a transformers or timm layout) and ``files`` to inspect what was pushed."""

    def __init__(self, tokens: dict[str, str] | None = None) -> None:
        self.tokens = dict(tokens or {})
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.thread.join()
            self.server = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    # ------------------------------------------------------------------ state

    def add_repo(
        self, repo_id: str, files: dict[str, bytes | str | Path], private: bool = False, gated: bool = False
    ) -> str:
        """Create ``repo_id`` holding ``files`` (bytes, or paths to read) in one commit; returns the commit."""
        with self.lock:
            self._create(repo_id, repo_id.split("/")[0], private)
            self.repos[repo_id].gated = gated
            blobs = {}
            for name, content in files.items():
                data = content if isinstance(content, bytes) else Path(content).read_bytes()
                blobs[name] = Blob(data, _is_lfs(name, len(data)))
            return self._commit(repo_id, "main", blobs, [], f"add {len(files)} files")

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        repo = self.repos[repo_id]
        return {p: b.data for p, b in repo.commits[repo.resolve(revision)].items()}

    def _create(self, repo_id: str, owner: str, private: bool) -> None:
        if repo_id in self.repos:
            raise HubError(409, None, "You already created this model repo")
        repo = self.repos[repo_id] = Repo(owner=owner, private=private)
        commit = hashlib.sha1(f"init {repo_id}".encode()).hexdigest()
        repo.commits[commit] = {".gitattributes": Blob(b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n", False)}
        repo.branches["main"] = commit

    def _commit(self, repo_id: str, branch: str, add: dict[str, Blob], delete: list[str], message: str) -> str:
        repo = self.repos[repo_id]
        parent = repo.branches.get(branch)
        if parent is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {branch}")
        files = {p: b for p, b in repo.commits[parent].items() if p not in delete}
        files.update(add)
        listing = "".join(f"{p} {b.etag}\n" for p, b in sorted(files.items()))
        commit = hashlib.sha1(f"{parent}\n{message}\n{listing}".encode()).hexdigest()
        repo.commits[commit] = files
        repo.branches[branch] = commit
        return commit


def _is_lfs(path: str, size: int) -> bool:
    return path.endswith(LFS_SUFFIXES) or size > LFS_MIN_SIZE


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args) -> None:  # quiet: the test output stays readable
        pass

    def handle(self) -> None:
        """A client that hangs up before its answer is written (a loader that gave up on a slow repo, an app
        process a test has ended) is normal for a server: without this, socketserver prints the
        ``BrokenPipeError`` traceback on stderr, among a passing run's dots."""
        try:
            super().handle()
        except ConnectionError:  # BrokenPipeError, ConnectionResetError, ConnectionAbortedError
            self.close_connection = True

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    # ------------------------------------------------------------------ plumbing

    def _dispatch(self, method: str) -> None:
        hub = self.hub
        parts = urlsplit(self.path)
        path, self.query = unquote(parts.path), parse_qs(parts.query)
        with hub.lock:
            hub.requests.append((method, parts.path))
        body = self._read_body()
        routes = [
            ("POST", r"/api/repos/create", self._create_repo),
            ("POST", r"/api/validate-yaml", self._validate_yaml),
            ("GET", r"/api/whoami-v2", self._whoami),
            ("GET", rf"/api/models/{_REPO}(?:/revision/(?P<rev>[^/]+))?", self._model_info),
            ("GET", rf"/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?", self._tree),
            ("POST", rf"/api/models/{_REPO}/preupload/(?P<rev>[^/]+)", self._preupload),
            ("POST", rf"/api/models/{_REPO}/commit/(?P<rev>[^/]+)", self._commit),
            ("POST", rf"/{_REPO}\.git/info/lfs/objects/batch", self._lfs_batch),
            ("PUT", r"/lfs/(?P<oid>[0-9a-f]{64})", self._lfs_put),
            ("GET", rf"/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)", self._resolve),
            ("HEAD", rf"/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)", self._resolve),
        ]
        try:
            for m, pattern, handler in routes:
                match = re.fullmatch(pattern, path)
                if m == method and match:
                    with hub.lock:
                        handler(body=body, head=method == "HEAD", **match.groupdict())
                    return
            raise HubError(404, None, f"no route {method} {path}")
        except HubError as e:
            headers = {"X-Error-Message": e.message}
            if e.code:
                headers["X-Error-Code"] = e.code
            if e.commit:
                headers["X-Repo-Commit"] = e.commit
            self._send(e.status, json.dumps({"error": e.message}).encode(), "application/json", headers, method)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(
        self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None, method: str = "GET"
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(body)

    def _json(self, obj: object, status: int = 200) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _user(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        if not auth:
            return None
        user = self.hub.tokens.get(auth.removeprefix("Bearer ").strip())
        if user is None:
            raise HubError(401, None, "Invalid credentials in Authorization header")
        return user

    def _readable(self, repo_id: str) -> Repo:
        repo = self.hub.repos.get(repo_id)
        user = self._user()
        if repo is None or (repo.private and user != repo.owner):
            status = 401 if user is None else 404
            raise HubError(status, "RepoNotFound", "Repository not found")
        if repo.gated and user is None:
            raise HubError(401, "GatedRepo", "Access to this model is restricted; you must be authenticated")
        return repo

    def _writable(self, repo_id: str) -> Repo:
        repo = self._readable(repo_id)
        if self._user() != repo.owner:
            raise HubError(403, None, "You don't have the rights to write to this repo")
        return repo

    def _revision(self, repo: Repo, rev: str) -> str:
        commit = repo.resolve(rev)
        if commit is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return commit

    # ------------------------------------------------------------------ endpoints

    def _create_repo(self, body: bytes, **_) -> None:
        user = self._user()
        if user is None:
            raise HubError(401, None, "You must be authenticated to create a repo")
        payload = json.loads(body)
        owner = payload.get("organization") or user
        if owner != user:
            raise HubError(403, None, f"You don't have the rights to create a model under the namespace {owner}")
        repo_id = f"{owner}/{payload['name']}"
        private = payload.get("visibility") == "private" or bool(payload.get("private"))
        try:
            self.hub._create(repo_id, owner, private)
        except HubError as e:
            self._json({"error": e.message, "url": f"{self.hub.url}/{repo_id}"}, 409)
            return
        self._json({"url": f"{self.hub.url}/{repo_id}", "name": repo_id, "id": repo_id})

    def _validate_yaml(self, body: bytes, **_) -> None:
        content = json.loads(body)["content"]
        match = re.match(r"---\n(.*?)\n---", content, re.S)
        try:
            meta = yaml.safe_load(match.group(1)) if match else None
        except yaml.YAMLError as e:
            self._json({"errors": [{"message": f"invalid YAML: {e}"}], "warnings": []}, 400)
            return
        if match and not isinstance(meta, dict):
            self._json({"errors": [{"message": "metadata must be a mapping"}], "warnings": []}, 400)
            return
        if meta and meta.get("license", "other") not in LICENSES:
            message = f'"license" must be one of [{", ".join(LICENSES)}]'
            self._json({"errors": [{"message": message}], "warnings": []}, 400)
            return
        self._json({"errors": [], "warnings": []})

    def _whoami(self, **_) -> None:
        user = self._user()
        if user is None:
            raise HubError(401, None, "Invalid username or password.")
        self._json({"type": "user", "name": user, "orgs": [], "auth": {"type": "access_token"}})

    def _model_info(self, repo: str, rev: str | None = None, **_) -> None:
        r = self._readable(repo)
        commit = self._revision(r, rev or "main")
        files = r.commits[commit]
        card = {}
        if "README.md" in files:
            match = re.match(r"---\n(.*?)\n---", files["README.md"].data.decode(), re.S)
            card = yaml.safe_load(match.group(1)) if match else {}
        info = {
            "_id": hashlib.sha1(repo.encode()).hexdigest()[:24],
            "id": repo,
            "modelId": repo,
            "author": r.owner,
            "sha": commit,
            "private": r.private,
            "gated": "auto" if r.gated else False,
            "disabled": False,
            "tags": card.get("tags", []),
            "pipeline_tag": card.get("pipeline_tag"),
            "library_name": card.get("library_name"),
            "cardData": card,
            "siblings": [{"rfilename": p} for p in sorted(files)],
            "downloads": 0,
            "likes": 0,
        }
        self._json(info)

    def _tree(self, repo: str, rev: str, path: str | None = None, **_) -> None:
        r = self._readable(repo)
        files = r.commits[self._revision(r, rev)]
        prefix = (path or "").strip("/")
        prefix = prefix + "/" if prefix else ""
        recursive = self.query.get("recursive", ["false"])[0].lower() == "true"
        entries, folders = [], set()
        for p, blob in sorted(files.items()):
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix) :]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.split("/")[0])
                continue
            entry = {"type": "file", "oid": blob.git_oid, "size": len(blob.data), "path": p}
            if blob.lfs:
                entry["lfs"] = {"oid": blob.sha256, "size": len(blob.data), "pointerSize": 134}
            entries.append(entry)
        if recursive:
            folders = {
                "/".join(p.split("/")[:i]) for p in files if p.startswith(prefix) for i in range(1, p.count("/") + 1)
            }
        tree_oid = hashlib.sha1(b"tree").hexdigest()
        self._json([{"type": "directory", "oid": tree_oid, "size": 0, "path": f} for f in sorted(folders)] + entries)

    def _preupload(self, repo: str, rev: str, body: bytes, **_) -> None:
        r = self._writable(repo)
        current = r.commits[self._revision(r, rev)]
        out = []
        for f in json.loads(body)["files"]:
            lfs = _is_lfs(f["path"], f["size"])
            blob = current.get(f["path"])
            oid = None if blob is None else (blob.sha256 if blob.lfs else blob.git_oid)
            out.append(
                {"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid}
            )
        self._json({"files": out, "commitOid": r.branches.get(rev)})

    def _lfs_batch(self, repo: str, body: bytes, **_) -> None:
        self._writable(repo)
        request = json.loads(body)
        objects = []
        for obj in request["objects"]:
            entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if obj["oid"] not in self.hub.lfs:
                entry["actions"] = {"upload": {"href": f"{self.hub.url}/lfs/{obj['oid']}", "header": {}}}
            objects.append(entry)
        self._send(200, json.dumps({"transfer": "basic", "objects": objects}).encode(), "application/vnd.git-lfs+json")

    def _lfs_put(self, oid: str, body: bytes, **_) -> None:
        if hashlib.sha256(body).hexdigest() != oid:
            raise HubError(400, None, "sha256 of the uploaded content does not match the oid")
        self.hub.lfs[oid] = body
        self._json({})

    def _commit(self, repo: str, rev: str, body: bytes, **_) -> None:
        self._writable(repo)
        if self.query.get("create_pr"):
            raise HubError(400, None, "pull requests are not supported by this test server")
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        header = next(item["value"] for item in lines if item["key"] == "header")
        add, delete = {}, []
        for item in lines:
            key, value = item["key"], item["value"]
            if key == "file":
                add[value["path"]] = Blob(base64.b64decode(value["content"]), False)
            elif key == "lfsFile":
                data = self.hub.lfs.get(value["oid"])
                if data is None:
                    raise HubError(422, None, f"LFS object {value['oid']} was never uploaded")
                add[value["path"]] = Blob(data, True)
            elif key in ("deletedFile", "deletedFolder"):
                delete.append(value["path"])
        commit = self.hub._commit(repo, rev, add, delete, header["summary"])
        self._json({"success": True, "commitOid": commit, "commitUrl": f"{self.hub.url}/{repo}/commit/{commit}"})

    def _resolve(self, repo: str, rev: str, path: str, head: bool, **_) -> None:
        r = self._readable(repo)
        commit = self._revision(r, rev)
        blob = r.commits[commit].get(path)
        if blob is None:
            raise HubError(404, "EntryNotFound", f"{path} does not exist on {rev}", commit=commit)
        headers = {"X-Repo-Commit": commit, "ETag": f'"{blob.etag}"', "Accept-Ranges": "bytes"}
        if blob.lfs:
            headers |= {"X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(len(blob.data))}
        data, status = blob.data, 200
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if match:
            start = int(match[1])
            end = int(match[2]) if match[2] else len(data) - 1
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start : end + 1], 206
        self._send(status, data, "application/octet-stream", headers, "HEAD" if head else "GET")


# ---------------------------------------------------------------------- repos laid out as the paper's checkpoints


def transformers_vit_files(
    id2label: dict[int, str], hidden_size: int = 32, layers: int = 2, heads: int = 2, seed: int = 0
) -> dict[str, bytes]:
    """The files of ``google/vit-base-patch16-224`` (transformers' ``ViTForImageClassification``), at tiny
    widths with random weights: ``config.json`` with that repo's fields (``architectures``, ``model_type``,
    ``id2label``/``label2id``...), its ``preprocessor_config.json``, and ``model.safetensors`` under
    transformers' key names ("vit."-prefixed encoder, "classifier" head)."""
    import torch
    from safetensors.torch import save

    g = torch.Generator().manual_seed(seed)
    D, H, P, K = hidden_size, 2 * hidden_size, 16, len(id2label)

    def t(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.02

    s = {
        "vit.embeddings.cls_token": t(1, 1, D),
        "vit.embeddings.position_embeddings": t(1, (224 // P) ** 2 + 1, D),
        "vit.embeddings.patch_embeddings.projection.weight": t(D, 3, P, P),
        "vit.embeddings.patch_embeddings.projection.bias": t(D),
    }
    for i in range(layers):
        layer = f"vit.encoder.layer.{i}."
        shapes = {f"attention.attention.{n}": (D, D) for n in ("query", "key", "value")}
        shapes |= {"attention.output.dense": (D, D), "intermediate.dense": (H, D), "output.dense": (D, H)}
        shapes |= {"layernorm_before": (D,), "layernorm_after": (D,)}
        for name, shape in shapes.items():
            s[f"{layer}{name}.weight"] = t(*shape) + (1 if len(shape) == 1 else 0)
            s[f"{layer}{name}.bias"] = t(shape[0])
    s |= {"vit.layernorm.weight": 1 + t(D), "vit.layernorm.bias": t(D)}
    s |= {"classifier.weight": t(K, D), "classifier.bias": t(K)}
    config = {
        "architectures": ["ViTForImageClassification"],
        "attention_probs_dropout_prob": 0.0,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "hidden_size": D,
        "id2label": {str(i): name for i, name in id2label.items()},
        "image_size": 224,
        "initializer_range": 0.02,
        "intermediate_size": H,
        "label2id": {name: i for i, name in id2label.items()},
        "layer_norm_eps": 1e-12,
        "model_type": "vit",
        "num_attention_heads": heads,
        "num_channels": 3,
        "num_hidden_layers": layers,
        "patch_size": P,
        "qkv_bias": True,
        "transformers_version": "4.13.0.dev0",
    }
    preprocessor = {
        "do_normalize": True,
        "do_resize": True,
        "feature_extractor_type": "ViTFeatureExtractor",
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "resample": 2,
        "size": 224,
    }
    return {
        "config.json": json.dumps(config, indent=2).encode(),
        "preprocessor_config.json": json.dumps(preprocessor, indent=2).encode(),
        "model.safetensors": save({k: v.contiguous() for k, v in s.items()}, metadata={"format": "pt"}),
    }


def timm_vit_files(
    architecture: str, tag: str, model_args: dict, num_classes: int = 1000, seed: int = 0
) -> dict[str, bytes]:
    """The files of one of timm's ViT repos (e.g. ``timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k``) with
    random weights: ``config.json`` as timm writes it (``architecture``, ``num_classes``, ``num_features``,
    ``global_pool``, ``pretrained_cfg``; no label names), plus the ``model_args`` that make it small, and
    ``model.safetensors`` under timm's key names."""
    import torch
    from safetensors.torch import save

    import vit_core

    cfg = vit_core.get_config(architecture, num_classes=num_classes, **model_args)
    torch.manual_seed(seed)
    state = vit_core.create_model(cfg).state_dict()
    pretrained_cfg = {
        "tag": tag,
        "custom_load": False,
        "input_size": [3, *cfg.img_hw],
        "fixed_input_size": True,
        "interpolation": "bicubic",
        "crop_pct": cfg.crop_pct,
        "crop_mode": "center",
        "mean": [0.5, 0.5, 0.5],
        "std": [0.5, 0.5, 0.5],
        "num_classes": num_classes,
        "pool_size": None,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
    }
    config = {
        "architecture": architecture,
        "num_classes": num_classes,
        "num_features": cfg.embed_dim,
        "global_pool": "token",
        "model_args": model_args,
        "pretrained_cfg": pretrained_cfg,
    }
    return {
        "config.json": json.dumps(config, indent=2).encode(),
        "model.safetensors": save({k: v.contiguous() for k, v in state.items()}, metadata={"format": "pt"}),
    }
