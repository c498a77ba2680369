"""Retrieval for tool-augmented rollouts: a corpus index, an HTTP server over it, and its client.

The server speaks Search-R1's retriever protocol, so a rollout can use this server or a Search-R1 one:

    POST /retrieve  {"queries": [q, ...], "topk": k, "return_scores": true}
                 -> {"result": [[{"document": {"id": ..., "contents": ...}, "score": s}, ...], ...]}
    GET  /health -> {"ok": true, "docs": N, "backend": "bm25"}

Back ends (:data:`BACKENDS`, by name):

- ``bm25``: BM25 (``bm25s``: Lucene's BM25 variant, English stop words) over the corpus; CPU, seconds for
  thousands of passages; what the CPU runs and the tests use.
- ``e5``: dense retrieval as in Search-R1: E5 embeddings (``intfloat/e5-base-v2`` by default; ``query: `` and
  ``passage: `` prefixes, mean pooling over the last hidden state, L2-normalised) in a FAISS inner-product index
  (``pip install faiss-cpu``, the ``search`` extra), for users with the 2018 Wikipedia corpus.

A corpus is a JSONL file of ``{"id", "contents"}`` records (Search-R1's ``wiki-18.jsonl``: contents =
``"Title"\\ntext``). Commands::

    python -m core.retrieval build --corpus corpus.jsonl --index DIR [--backend bm25|e5] [--model PATH]
    python -m core.retrieval serve --index DIR [--host 127.0.0.1] [--port 8000]

``build`` shows a progress bar and is cached: an index folder built from the same corpus bytes with the same back
end is reused. ``serve`` answers requests from many threads at once (a rollout sends a whole batch of queries,
and parallel jobs each send theirs); the index is searched under a lock.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

log = logging.getLogger("rlvr")

META = "meta.json"
DOCS = "docs.jsonl"


class RetrievalError(RuntimeError):
    """The retrieval server cannot be reached (not started, gone, or not a retrieval server): one line saying which."""


def corpus_digest(path: Path) -> str:
    """SHA-256 of the corpus file's bytes (the build cache key, with the back end and model)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def read_corpus(path) -> list[dict]:
    """The corpus records ``{"id", "contents"}`` (``text`` and ``title`` accepted for ``contents``).

    Raises:
        FileNotFoundError: naming the path; ValueError: a line that is not a JSON record with text, naming it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus {path} does not exist")
    docs = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                contents = rec.get("contents") or (f'"{rec["title"]}"\n{rec["text"]}' if "title" in rec else rec["text"])
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                raise ValueError(f"{path}:{i}: expected a JSON record with contents (or text)") from None
            docs.append({"id": str(rec.get("id", len(docs))), "contents": str(contents)})
    if not docs:
        raise ValueError(f"corpus {path} is empty")
    return docs


class BM25Index:
    """BM25 over the corpus (``bm25s``)."""

    name = "bm25"

    def __init__(self, retriever, docs: list[dict]):
        self.retriever, self.docs = retriever, docs

    @staticmethod
    def build(docs: list[dict], out: Path, model: str | None = None) -> None:
        import bm25s

        tokens = bm25s.tokenize([d["contents"] for d in docs], stopwords="en", show_progress=True)
        retriever = bm25s.BM25()
        retriever.index(tokens, show_progress=True)
        retriever.save(str(out / "bm25"), show_progress=False)

    @classmethod
    def load(cls, folder: Path, docs: list[dict]) -> "BM25Index":
        import bm25s

        return cls(bm25s.BM25.load(str(folder / "bm25"), show_progress=False), docs)

    def search(self, queries: list[str], k: int) -> list[list[tuple[dict, float]]]:
        import bm25s

        k = max(1, min(int(k), len(self.docs)))
        tokens = bm25s.tokenize([q or " " for q in queries], stopwords="en", show_progress=False)
        ids, scores = self.retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        return [[(self.docs[int(i)], float(s)) for i, s in zip(row_i, row_s)] for row_i, row_s in zip(ids, scores)]


class E5Index:
    """Dense E5 retrieval in a FAISS inner-product index (Search-R1's set-up)."""

    name = "e5"
    DEFAULT_MODEL = "intfloat/e5-base-v2"

    def __init__(self, index, docs, encoder):
        self.index, self.docs, self.encoder = index, docs, encoder

    @staticmethod
    def _encoder(model: str):
        import torch
        from transformers import AutoModel, AutoTokenizer

        tok, net = AutoTokenizer.from_pretrained(model), AutoModel.from_pretrained(model).eval()

        @torch.no_grad()
        def encode(texts: list[str], batch: int = 64, progress: bool = False):
            from tqdm.auto import tqdm

            out = []
            for a in tqdm(range(0, len(texts), batch), disable=not progress, desc="e5 encode"):
                enc = tok(texts[a:a + batch], padding=True, truncation=True, max_length=512, return_tensors="pt")
                hidden = net(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).float()
                emb = (hidden * mask).sum(1) / mask.sum(1)
                out.append(torch.nn.functional.normalize(emb, dim=-1).numpy())
            import numpy as np

            return np.concatenate(out).astype("float32")
        return encode

    @staticmethod
    def build(docs: list[dict], out: Path, model: str | None = None) -> None:
        try:
            import faiss
        except ImportError:
            raise ValueError("backend e5 needs faiss (pip install 'rlvr-suite[search]' or faiss-cpu)") from None
        encode = E5Index._encoder(model or E5Index.DEFAULT_MODEL)
        emb = encode([f"passage: {d['contents']}" for d in docs], progress=True)
        index = faiss.IndexFlatIP(emb.shape[1])
        index.add(emb)
        faiss.write_index(index, str(out / "index.faiss"))

    @classmethod
    def load(cls, folder: Path, docs: list[dict]) -> "E5Index":
        import faiss

        meta = json.loads((folder / META).read_text())
        return cls(faiss.read_index(str(folder / "index.faiss")), docs, cls._encoder(meta.get("model") or cls.DEFAULT_MODEL))

    def search(self, queries: list[str], k: int) -> list[list[tuple[dict, float]]]:
        emb = self.encoder([f"query: {q}" for q in queries])
        scores, ids = self.index.search(emb, max(1, min(int(k), len(self.docs))))
        return [[(self.docs[int(i)], float(s)) for i, s in zip(row_i, row_s) if i >= 0] for row_i, row_s in zip(ids, scores)]


BACKENDS = {"bm25": BM25Index, "e5": E5Index}


def build_index(corpus, index_dir, backend: str = "bm25", model: str | None = None) -> Path:
    """Build (or reuse) the index of ``corpus`` in ``index_dir``: reused when its ``meta.json`` names the same corpus
    digest, back end and model. Writes ``docs.jsonl`` (the passages) and the back end's files.

    Raises:
        ValueError: an unknown back end, or a bad corpus (see :func:`read_corpus`).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {sorted(BACKENDS)}")
    corpus, out = Path(corpus), Path(index_dir)
    digest = corpus_digest(corpus)
    want = {"corpus_sha256": digest, "backend": backend, "model": model}
    meta = out / META
    if meta.is_file():
        have = json.loads(meta.read_text())
        if {k: have.get(k) for k in want} == want:
            return out
    docs = read_corpus(corpus)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (DOCS + ".tmp")
    tmp.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    tmp.replace(out / DOCS)
    BACKENDS[backend].build(docs, out, model)
    meta.write_text(json.dumps({**want, "docs": len(docs), "corpus": str(corpus)}))  # written last: a complete index
    return out


def load_index(index_dir):
    """The searchable index in ``index_dir`` (built by :func:`build_index`)."""
    folder = Path(index_dir)
    if not (folder / META).is_file():
        raise FileNotFoundError(f"{folder}: no built index there (python -m core.retrieval build --corpus ... --index {folder})")
    meta = json.loads((folder / META).read_text())
    docs = [json.loads(x) for x in (folder / DOCS).read_text(encoding="utf-8").splitlines() if x.strip()]
    return BACKENDS[meta["backend"]].load(folder, docs)


# ------------------------------------------------------------------------------------------- server

def make_server(index, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server (one thread per request) answering :mod:`core.retrieval`'s protocol from ``index``."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet: a rollout sends thousands of requests
            pass

        def _reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.rstrip("/") == "/health":
                return self._reply(200, {"ok": True, "docs": len(index.docs), "backend": index.name})
            self._reply(404, {"error": f"unknown path {self.path}"})

        def do_POST(self):
            if self.path.rstrip("/") != "/retrieve":
                return self._reply(404, {"error": f"unknown path {self.path}"})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                queries = [str(q) for q in body["queries"]]
                k = int(body.get("topk", 3))
            except (ValueError, KeyError, TypeError) as e:
                return self._reply(400, {"error": f"bad request: {type(e).__name__}: {e}"})
            with lock:
                hits = index.search(queries, k)
            scores = bool(body.get("return_scores", True))
            self._reply(200, {"result": [[{"document": d, **({"score": s} if scores else {})} for d, s in row]
                                         for row in hits]})

    class Server(ThreadingHTTPServer):
        request_queue_size = 256  # the listen backlog (socketserver's default, 5, resets a burst of parallel calls)
        daemon_threads = True

    return Server((host, port), Handler)


class RetrievalServer:
    """A retrieval server over ``index_dir`` in a child process (``python -m core.retrieval serve``) on a free port
    of 127.0.0.1, stopped by :meth:`close` (or at exit). ``url`` is where it answers."""

    def __init__(self, index_dir, host: str = "127.0.0.1", start_timeout_s: float = 120.0):
        import atexit
        import tempfile

        # its stderr goes to a file, never a pipe nobody reads (a full pipe would stall the server mid-run)
        self.log = tempfile.NamedTemporaryFile(prefix="rlvr-retrieval-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, "-m", "core.retrieval", "serve", "--index", str(index_dir),
                                      "--host", host, "--port", "0"], stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, cwd=str(Path(__file__).resolve().parent.parent))
        line, deadline = "", time.time() + start_timeout_s
        while time.time() < deadline and not line.startswith("listening "):
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                raise RetrievalError(f"the retrieval server over {index_dir} exited at start: "
                                     f"{Path(self.log.name).read_text(errors='replace')[-500:].strip()}")
        if not line.startswith("listening "):
            self.close()
            raise RetrievalError(f"the retrieval server over {index_dir} did not start in {start_timeout_s:.0f} s")
        self.url = line.split()[1]
        atexit.register(self.close)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------- client

def retrieve(url: str, queries: list[str], topk: int = 3, timeout_s: float = 10.0) -> list[list[dict]]:
    """The top ``topk`` passages (``{"id", "contents"}``) for each query from the server at ``url``.

    Raises:
        RetrievalError: the server is not there (connection refused, name not found), naming the URL.
        TimeoutError, urllib.error.HTTPError, ValueError: a request that failed while the server is there (the
            search tool turns these into an error text for the policy).
    """
    req = urllib.request.Request(url.rstrip("/") + "/retrieve", method="POST",
                                 data=json.dumps({"queries": list(queries), "topk": int(topk), "return_scores": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError:
        raise
    except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError):
            raise TimeoutError(f"no answer in {timeout_s:g} s") from None
        raise RetrievalError(f"retrieval server at {url} is not answering ({e.reason}); start one with "
                             "python -m core.retrieval serve --index DIR, or set tools.search.url") from None
    except ConnectionError as e:
        raise RetrievalError(f"retrieval server at {url} dropped the connection ({type(e).__name__}); is it still "
                             "running?") from None
    result = body.get("result")
    if not isinstance(result, list) or len(result) != len(queries):
        raise ValueError(f"retrieval server at {url}: expected {len(queries)} result lists, got {str(body)[:200]}")
    return [[(h.get("document") or h) for h in row] for row in result]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m core.retrieval", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or reuse) an index of a corpus")
    b.add_argument("--corpus", required=True)
    b.add_argument("--index", required=True)
    b.add_argument("--backend", default="bm25", choices=sorted(BACKENDS))
    b.add_argument("--model", default=None, help="e5: the encoder (hub id or folder; default intfloat/e5-base-v2)")
    s = sub.add_parser("serve", help="serve an index over HTTP")
    s.add_argument("--index", required=True)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "build":
            out = build_index(args.corpus, args.index, args.backend, args.model)
            print(f"index ready: {out}")
            return 0
        server = make_server(load_index(args.index), args.host, args.port)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"listening http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
