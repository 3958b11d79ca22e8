"""A Hub-compatible HTTP server for the tests, on 127.0.0.1 (stdlib `http.server` in a thread).

It implements only what huggingface_hub calls for the operations the trainers use: `whoami`, `create_repo`,
`create_branch`, `repo_info`, `preupload` (every file "regular", with the remote blob id so unchanged files are
dropped as on the Hub), `commit` (ndjson, base64 files, file / folder deletions), `validate-yaml`, the tree
listing and file `resolve` (HEAD and GET). Every commit is recorded (repo, branch, message, files added and
deleted) so tests can compare two trainers' commit sequences. `gate` (a `threading.Event`) holds every preupload
and commit while it is cleared, which makes "a push is still running" deterministic.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import itertools
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

USER = "tester"


def git_blob_id(content: bytes) -> str:
    """The git blob sha1 huggingface_hub computes for a regular file (its `_local_oid`)."""
    return hashlib.sha1(b"blob " + str(len(content)).encode() + b"\0" + content).hexdigest()


@dataclasses.dataclass(frozen=True)
class CommitRecord:
    """One commit as the server received it."""

    repo_id: str
    branch: str
    sha: str
    message: str
    added: tuple[str, ...]
    deleted: tuple[str, ...]


@dataclasses.dataclass
class Repo:
    private: bool
    branches: dict[str, str]  # branch -> commit sha
    trees: dict[str, dict[str, bytes]]  # commit sha -> path -> content


class HubState:
    """Repos, tokens and the commit log; every access holds `lock`."""

    def __init__(self, tokens: dict[str, str]):
        self.tokens = dict(tokens)  # token -> user name
        self.repos: dict[str, Repo] = {}
        self.commits: list[CommitRecord] = []
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()
        self._shas = itertools.count(1)

    def new_sha(self) -> str:
        return hashlib.sha1(f"commit-{next(self._shas)}".encode()).hexdigest()

    def reset(self) -> None:
        with self.lock:
            self.repos.clear()
            self.commits.clear()
            self.requests.clear()
        self.gate.set()

    def commits_of(self, repo_id: str) -> list[CommitRecord]:
        with self.lock:
            return [commit for commit in self.commits if commit.repo_id == repo_id]

    def tree(self, repo_id: str, branch: str = "main") -> dict[str, bytes]:
        with self.lock:
            repo = self.repos[repo_id]
            return dict(repo.trees[repo.branches[branch]])


class _Error(Exception):
    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def _handler(state: HubState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args) -> None:  # quiet
            pass

        # ---- plumbing
        def _body(self) -> bytes:
            return self._request_body

        def _send(self, status: int, payload=None, headers: dict | None = None, raw: bytes | None = None) -> None:
            data = raw if raw is not None else json.dumps(payload if payload is not None else {}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if raw is None else "application/octet-stream")
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _user(self) -> str | None:
            auth = self.headers.get("Authorization") or ""
            token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None
            if token is None:
                return None
            if token not in state.tokens:
                raise _Error(401, "Invalid credentials in Authorization header")
            return state.tokens[token]

        def _writer(self) -> str:
            user = self._user()
            if user is None:
                raise _Error(401, "You must be authenticated to access this resource")
            return user

        def _repo(self, repo_id: str, write: bool = False) -> Repo:
            user = self._writer() if write else self._user()
            repo = state.repos.get(repo_id)
            if repo is None or (repo.private and user != repo_id.split("/")[0]):
                raise _Error(404, f"Repository not found: {repo_id}", "RepoNotFound")
            if write and user != repo_id.split("/")[0]:
                raise _Error(403, f"You don't have the rights to write to {repo_id}")
            return repo

        @staticmethod
        def _head(repo: Repo, revision: str) -> str:
            if revision in repo.branches:
                return repo.branches[revision]
            if revision in repo.trees:
                return revision
            raise _Error(404, f"Invalid rev id: {revision}", "RevisionNotFound")

        def _dispatch(self) -> None:
            url = urlsplit(self.path)
            parts = [unquote(part) for part in url.path.strip("/").split("/")]
            query = parse_qs(url.query)
            with state.lock:
                state.requests.append((self.command, url.path))
            if parts[:2] == ["api", "whoami-v2"]:
                user = self._writer()
                return self._send(200, {"type": "user", "name": user, "orgs": [], "auth": {"type": "access_token"}})
            if parts[:3] == ["api", "repos", "create"] and self.command == "POST":
                return self._create_repo(json.loads(self._body() or b"{}"))
            if parts[:2] == ["api", "validate-yaml"]:
                return self._send(200, {"errors": [], "warnings": []})
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                return self._model_api(f"{parts[2]}/{parts[3]}", parts[4:], query)
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
            raise _Error(404, f"Not implemented by the test Hub: {self.command} {url.path}")

        def _handle(self) -> None:
            # The whole body is read first: a keep-alive connection must not keep an unread body.
            length = int(self.headers.get("Content-Length") or 0)
            self._request_body = self.rfile.read(length) if length else b""
            try:
                self._dispatch()
            except _Error as error:
                headers = {"X-Error-Code": error.code} if error.code else {}
                headers["X-Error-Message"] = error.message
                self._send(error.status, {"error": error.message}, headers)

        do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _handle

        # ---- endpoints
        def _create_repo(self, payload: dict) -> None:
            user = self._writer()
            namespace = payload.get("organization") or user
            if namespace != user:
                raise _Error(403, f"You don't have the rights to create a model under the namespace {namespace}")
            repo_id = f"{namespace}/{payload['name']}"
            url = f"http://{self.headers['Host']}/{repo_id}"
            with state.lock:
                if repo_id in state.repos:
                    return self._send(409, {"error": "You already created this model repo", "url": url})
                sha = state.new_sha()
                initial = {".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"}
                state.repos[repo_id] = Repo(
                    private=payload.get("visibility") == "private", branches={"main": sha}, trees={sha: initial}
                )
            self._send(200, {"url": url, "name": repo_id})

        def _model_api(self, repo_id: str, rest: list[str], query: dict) -> None:
            if not rest or rest[0] == "revision":
                with state.lock:
                    repo = self._repo(repo_id)
                    sha = self._head(repo, rest[1] if len(rest) > 1 else "main")
                    tree = repo.trees[sha]
                    info = {
                        "id": repo_id, "modelId": repo_id, "sha": sha, "private": repo.private,
                        "siblings": [{"rfilename": path} for path in sorted(tree)],
                    }
                return self._send(200, info)
            action = rest[0]
            if action == "branch" and self.command == "POST":
                payload = json.loads(self._body() or b"{}")
                with state.lock:
                    repo = self._repo(repo_id, write=True)
                    if rest[1] in repo.branches:
                        raise _Error(409, f"Reference already exists: refs/heads/{rest[1]}")
                    repo.branches[rest[1]] = self._head(repo, payload.get("startingPoint") or "main")
                return self._send(200, {})
            if action == "preupload" and self.command == "POST":
                payload = json.loads(self._body())
                # Held too, so a held push reads its files only once training has ended: otherwise whether the
                # first commit carries step 1's weights or a later save's (and so whether later pushes find
                # anything changed) would depend on thread timing.
                state.gate.wait()
                with state.lock:
                    repo = self._repo(repo_id, write=True)
                    tree = repo.trees[self._head(repo, rest[1])]
                    files = [
                        {
                            "path": item["path"], "uploadMode": "regular", "shouldIgnore": False,
                            "oid": git_blob_id(tree[item["path"]]) if item["path"] in tree else None,
                        }
                        for item in payload["files"]
                    ]
                return self._send(200, {"files": files, "commitOid": self._head(repo, rest[1])})
            if action == "commit" and self.command == "POST":
                return self._commit(repo_id, rest[1], self._body())
            if action == "tree":
                return self._tree(repo_id, rest[1], "/".join(rest[2:]))
            raise _Error(404, f"Not implemented by the test Hub: {self.command} {action}")

        def _commit(self, repo_id: str, branch: str, body: bytes) -> None:
            lines = [json.loads(line) for line in body.splitlines() if line.strip()]
            with state.lock:
                self._repo(repo_id, write=True)
            state.gate.wait()  # a cleared gate holds the commit: "a push is running"
            with state.lock:
                repo = self._repo(repo_id, write=True)
                if branch not in repo.branches:
                    raise _Error(404, f"Invalid rev id: {branch}", "RevisionNotFound")
                tree = dict(repo.trees[repo.branches[branch]])
                message, added, deleted = "", [], []
                for line in lines:
                    key, value = line["key"], line["value"]
                    if key == "header":
                        message = value["summary"]
                    elif key == "file":
                        tree[value["path"]] = base64.b64decode(value["content"])
                        added.append(value["path"])
                    elif key == "deletedFile":
                        if tree.pop(value["path"], None) is None:
                            raise _Error(404, "A file with this name doesn't exist", "EntryNotFound")
                        deleted.append(value["path"])
                    elif key == "deletedFolder":
                        prefix = value["path"].rstrip("/") + "/"
                        for path in [p for p in tree if p.startswith(prefix)]:
                            del tree[path]
                            deleted.append(path)
                    else:
                        raise _Error(400, f"The test Hub takes regular files only, not {key!r}")
                sha = state.new_sha()
                repo.trees[sha] = tree
                repo.branches[branch] = sha
                state.commits.append(CommitRecord(repo_id, branch, sha, message, tuple(added), tuple(deleted)))
            url = f"http://{self.headers['Host']}/{repo_id}/commit/{sha}"
            self._send(200, {"success": True, "commitOid": sha, "commitUrl": url, "pullRequestUrl": None})

        def _tree(self, repo_id: str, revision: str, prefix: str) -> None:
            with state.lock:
                repo = self._repo(repo_id)
                tree = repo.trees[self._head(repo, revision)]
                entries = [
                    {"type": "file", "oid": git_blob_id(content), "size": len(content), "path": path}
                    for path, content in sorted(tree.items())
                    if not prefix or path.startswith(prefix.rstrip("/") + "/")
                ]
            self._send(200, entries)

        def _resolve(self, repo_id: str, revision: str, path: str) -> None:
            with state.lock:
                repo = self._repo(repo_id)
                sha = self._head(repo, revision)
                content = repo.trees[sha].get(path)
            if content is None:
                raise _Error(404, f"Entry not found: {path}", "EntryNotFound")
            headers = {"X-Repo-Commit": sha, "ETag": f'"{git_blob_id(content)}"'}
            self._send(200, raw=content, headers=headers)

    return Handler


class HubServer:
    """The server, its thread and its state; `url` is what HF_ENDPOINT is set to."""

    def __init__(self, tokens: dict[str, str]):
        self.state = HubState(tokens)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="test-hub", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.state.gate.set()
        self._server.shutdown()
        self._server.server_close()


def iter_files(tree: dict[str, bytes], prefix: str = "") -> Iterator[str]:
    """The paths of `tree` under `prefix`, sorted."""
    yield from sorted(path for path in tree if path.startswith(prefix))


# ---------------------------------------------------------------- test helpers

TOKEN = "hf_TESTtokenRECOGNISABLE0123456789"  # a recognisable secret the token checks search for
OTHER_TOKEN = "hf_OTHERtokenFOROTHERUSER987654321"
OTHER_USER = "other"
_SHARED: list[HubServer] = []


def shared_server() -> HubServer:
    """One server per test process (started on first use); each user of it resets its state first."""
    if not _SHARED:
        _SHARED.append(HubServer({TOKEN: USER, OTHER_TOKEN: OTHER_USER}))
    return _SHARED[0]


def point_hub_at(server: HubServer, mp, token: str | None = TOKEN) -> None:
    """Point huggingface_hub (and transformers' shared client) at `server` through `mp` (a MonkeyPatch).

    Environment variables for subprocesses, the already-read constants for this process; no cached login.
    """
    import huggingface_hub.constants as constants
    import transformers.utils.hub as transformers_hub

    mp.setenv("HF_ENDPOINT", server.url)
    mp.setenv("HF_HUB_OFFLINE", "0")
    mp.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if token is None:
        mp.delenv("HF_TOKEN", raising=False)
    else:
        mp.setenv("HF_TOKEN", token)
    mp.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    mp.setattr(constants, "ENDPOINT", server.url)
    mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.url + "/{repo_id}/resolve/{revision}/{filename}")
    mp.setattr(constants, "HF_HUB_OFFLINE", False)
    mp.setattr(constants, "HF_TOKEN_PATH", os.path.join(os.sep, "nonexistent-hf-home", "token"))
    mp.setattr(transformers_hub, "_hf_api", None)


class _Callback:
    """Answers every callback event the trainer fires with a no-op (usable by both trainers' handlers)."""

    def __getattr__(self, name: str):
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


class WaitForPushes(_Callback):
    """A callback (for either trainer) that waits at `on_save` until the pushes of that save are done.

    Both trainers push right after writing a checkpoint and call `on_save` after that, so with this callback
    every save's push happens (none is skipped as "still running"): the commit sequence is deterministic.
    """

    def __init__(self) -> None:
        self.trainer = None

    def on_save(self, args, state, control, **kwargs):
        in_progress = getattr(self.trainer, "push_in_progress", None)
        if in_progress is not None:
            in_progress.wait_until_done()


class HoldCommitsDuringTraining(_Callback):
    """A callback that clears the server's gate at train begin and sets it at train end.

    The first push then waits, before it sends its files, until training ends, so every later save finds "a push
    still running" and every push sends the files of the last save.
    """

    def __init__(self, server: HubServer) -> None:
        self.server = server
        self.push_begins = 0  # on_push_begin calls: one per push that was not skipped

    def on_push_begin(self, args, state, control, **kwargs):
        self.push_begins += 1

    def on_train_begin(self, args, state, control, **kwargs):
        self.server.state.gate.clear()

    def on_train_end(self, args, state, control, **kwargs):
        self.server.state.gate.set()
