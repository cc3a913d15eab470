"""Load test of the served models: concurrent clients, every answer checked against eager PyTorch.

    python examples/torchserve/client.py --url http://127.0.0.1:18080 --weights WORK/weights.pth \\
        --models tinynet_eager tinynet_ember --requests 1000 --clients 8 --report report.json

After an untimed warm-up of every model, each model gets ``--requests`` requests (batches of 1 to 4
random images, the same requests for every model) from ``--clients`` threads, each with its own
keep-alive connection, in ``--rounds`` slices with the models taking turns. An answer is *wrong* when
its logits differ from the eager model's (same weights, computed here) beyond ``--rtol``/``--atol``;
a *server error* is a 5xx answer, a refused connection or a timeout. For a compiled model every
answer must also show compiled graphs serving it (``ember.graph_calls`` grows, no eager fallback,
no compile after the warm-up). Then bad requests (wrong shape, wrong dtype, empty body, not .npy,
JSON) must get HTTP 400 with a message, and a good request after them must still be answered.
Prints a table (p50/p99 latency, requests/s) and writes the numbers as JSON; exit status 1 when
anything failed.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import sys
import threading
import time

import numpy as np
import requests
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serving_protocol as proto  # noqa: E402
from model import TinyNet  # noqa: E402

OCTET = {"Content-Type": "application/octet-stream"}


def make_requests(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(rng.integers(1, 5)), *proto.SAMPLE_SHAPE), dtype=np.float32) for _ in range(n)]


def eager_answers(weights: str, batches: list[np.ndarray]) -> list[np.ndarray]:
    model = TinyNet()
    model.load_state_dict(torch.load(weights, map_location="cpu"))
    model.eval()
    with torch.inference_mode():
        return [model(torch.from_numpy(b)).numpy() for b in batches]


class Tally:
    """Results of one model's load test, filled by several threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.latencies_ms: list[float] = []
        self.ok = self.wrong = self.server_errors = self.client_errors = 0
        self.not_compiled = 0  # answers of a compiled model that do not show compiled graphs
        self.graph_calls: list[int] = []
        self.graphs: set = set()
        self.renderers: dict = {}  # the native backend's graphs by renderer (cpp / triton / aten)
        self.fallbacks = 0
        self.examples: list[str] = []

    def note(self, text: str) -> None:
        if len(self.examples) < 5:
            self.examples.append(text)


def one_request(session, url, body, expected, tally: Tally, compiled: bool, rtol, atol) -> None:
    start = time.perf_counter()
    try:
        r = session.post(url, data=body, headers=OCTET, timeout=120)
    except requests.RequestException as exc:
        with tally.lock:
            tally.server_errors += 1
            tally.note(f"request failed: {type(exc).__name__}: {exc}")
        return
    ms = (time.perf_counter() - start) * 1e3
    with tally.lock:
        tally.latencies_ms.append(ms)
        if r.status_code >= 500:
            tally.server_errors += 1
            tally.note(f"HTTP {r.status_code}: {r.text[:200]}")
            return
        if r.status_code != 200:
            tally.client_errors += 1
            tally.note(f"HTTP {r.status_code}: {r.text[:200]}")
            return
    answer = r.json()
    got = np.asarray(answer["logits"], dtype=np.float32)
    right = got.shape == expected.shape and np.allclose(got, expected, rtol=rtol, atol=atol)
    stats = answer["ember"]
    with tally.lock:
        if right:
            tally.ok += 1
        else:
            tally.wrong += 1
            diff = float(np.abs(got - expected).max()) if got.shape == expected.shape else got.shape
            tally.note(f"wrong answer: max difference {diff}")
        if compiled:
            tally.graph_calls.append(stats["graph_calls"])
            tally.graphs.add(stats["graphs"])
            tally.renderers.update(stats.get("renderers") or {})
            tally.fallbacks = max(tally.fallbacks, stats["eager_fallbacks"])
            if stats["graph_calls"] < 1 or stats["eager_fallbacks"]:
                tally.not_compiled += 1


def load_test(base: str, models: list[str], batches, answers, clients: int, rounds: int, rtol, atol) -> list[dict]:
    """Every model gets all requests, in ``rounds`` slices taken in turn (the model order rotating
    each round), so that a slow spell of the machine or the server warming up does not fall on
    one model only."""
    bodies = [proto.encode(b) for b in batches]
    tallies = {m: Tally() for m in models}
    walls = dict.fromkeys(models, 0.0)
    sessions = threading.local()
    bounds = np.linspace(0, len(bodies), rounds + 1).astype(int)
    for r in range(rounds):
        for model in models[r % len(models):] + models[:r % len(models)]:
            url, compiled = f"{base}/predictions/{model}", not model.endswith("_eager")

            def work(i, url=url, compiled=compiled, tally=tallies[model]):
                if not hasattr(sessions, "s"):
                    sessions.s = requests.Session()
                one_request(sessions.s, url, bodies[i], answers[i], tally, compiled, rtol, atol)

            start = time.perf_counter()
            with cf.ThreadPoolExecutor(clients) as pool:
                list(pool.map(work, range(bounds[r], bounds[r + 1])))
            walls[model] += time.perf_counter() - start
    return [_row(m, tallies[m], walls[m], batches, clients) for m in models]


def _row(model: str, tally: Tally, wall: float, batches, clients: int) -> dict:
    lat = np.asarray(tally.latencies_ms) if tally.latencies_ms else np.asarray([float("nan")])
    calls = sorted(tally.graph_calls)
    return {
        "model": model, "requests": len(batches), "clients": clients, "ok": tally.ok, "wrong": tally.wrong,
        "server_errors": tally.server_errors, "client_errors": tally.client_errors,
        "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
        "mean_ms": float(lat.mean()), "requests_per_s": len(batches) / wall,
        "samples_per_s": sum(len(b) for b in batches) / wall, "wall_s": wall,
        "compiled": not model.endswith("_eager"), "not_compiled_answers": tally.not_compiled,
        "graph_calls_during_test": (calls[-1] - calls[0] + 1) if calls else 0,
        "graphs": sorted(tally.graphs), "renderers": dict(tally.renderers), "eager_fallbacks": tally.fallbacks,
        "examples": tally.examples,
    }


def warm_up(base: str, models: list[str], batches, clients: int, n: int = 200) -> None:
    """Untimed requests to every model first: TorchServe's Java frontend compiles its hot paths
    (JIT) during the first few hundred requests, which would otherwise slow whichever model is
    measured first."""
    bodies = [proto.encode(b) for b in batches[:n]]
    for model in models:
        url = f"{base}/predictions/{model}"
        with cf.ThreadPoolExecutor(clients) as pool:
            for r in pool.map(lambda body: requests.post(url, data=body, headers=OCTET, timeout=120), bodies):
                r.raise_for_status()


def bad_requests(base: str, model: str, good: np.ndarray, expected: np.ndarray) -> dict:
    """Each malformed request must get HTTP 400 with a message; the server must keep serving."""
    url = f"{base}/predictions/{model}"
    cases = {
        "wrong shape": (proto.encode(np.zeros((2, 3, 16, 16), np.float32)), OCTET),
        "wrong dtype": (proto.encode(np.zeros((2, *proto.SAMPLE_SHAPE), np.float64)), OCTET),
        "empty body": (b"", OCTET),
        "not .npy": (b"\x00garbage" * 10, OCTET),
        "JSON body": (json.dumps({"inputs": [[1.0, 2.0]]}).encode(), {"Content-Type": "application/json"}),
    }
    results = {}
    for name, (body, headers) in cases.items():
        r = requests.post(url, data=body, headers=headers, timeout=60)
        try:
            message = r.json().get("error", "")
        except ValueError:
            message = r.text
        results[name] = {"status": r.status_code, "error": message,
                         "ok": r.status_code == 400 and "send one float32 array" in message}
    r = requests.post(url, data=proto.encode(good), headers=OCTET, timeout=60)
    still = r.status_code == 200 and np.allclose(np.asarray(r.json()["logits"], np.float32), expected, rtol=1e-4, atol=1e-5)
    return {"cases": results, "still_serving": bool(still), "ok": bool(still and all(c["ok"] for c in results.values()))}


def passed(row: dict) -> bool:
    good = row["wrong"] == 0 and row["server_errors"] == 0 and row["client_errors"] == 0 and row["ok"] == row["requests"]
    if row["compiled"]:
        good = good and row["not_compiled_answers"] == 0 and row["eager_fallbacks"] == 0 and len(row["graphs"]) == 1
    return good and row["bad_requests"]["ok"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:18080")
    ap.add_argument("--weights", required=True)
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5, help="the requests are sent in this many slices, models in turn")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--atol", type=float, default=1e-5)
    ap.add_argument("--report", default=None, help="write the numbers here as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    batches = make_requests(args.requests)
    answers = eager_answers(args.weights, batches)
    warm_up(args.url, args.models, batches, args.clients)
    rows = load_test(args.url, args.models, batches, answers, args.clients, args.rounds, args.rtol, args.atol)
    for row in rows:
        row["bad_requests"] = bad_requests(args.url, row["model"], batches[0], answers[0])
        row["passed"] = passed(row)
    base = next((r for r in rows if not r["compiled"]), None)
    print(f"\n{'model':<18} {'requests':>8} {'wrong':>5} {'5xx':>4} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>7} "
          f"{'vs eager':>8} {'graph calls':>11} {'bad reqs':>8}")
    for r in rows:
        speed = f"{r['requests_per_s'] / base['requests_per_s']:.2f}x" if base else "-"
        calls = r["graph_calls_during_test"] if r["compiled"] else "-"
        print(f"{r['model']:<18} {r['requests']:>8} {r['wrong']:>5} {r['server_errors']:>4} {r['p50_ms']:>8.2f} "
              f"{r['p99_ms']:>8.2f} {r['requests_per_s']:>7.1f} {speed:>8} {calls:>11} "
              f"{'ok' if r['bad_requests']['ok'] else 'FAILED':>8}")
        for e in r["examples"]:
            print(f"    {e}")
    report = {"requests": args.requests, "clients": args.clients, "models": rows,
              "passed": all(r["passed"] for r in rows)}
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    print("\nPASSED" if report["passed"] else "\nFAILED")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
