"""warm_profile's child, plus the wall and main-thread CPU time of ember.frontend.persist.load (the warm
entry's whole load: frontend record, graph, backend compile from the aot and native caches; no running)."""
import json, os, sys, time
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import ember.frontend.persist as P
orig, T, C = P.load, [], []
def load(*a, **k):
    t, c = time.perf_counter(), time.thread_time(); r = orig(*a, **k)
    T.append(time.perf_counter() - t); C.append(time.thread_time() - c); return r
P.load = load
import warm_profile
rec = warm_profile.child(sys.argv[1], "cpu", False, (1, 64), False, 5)
print("LOAD", json.dumps(dict(row=rec["row"], first=rec["first_s"], steady=rec["steady_s"], load=round(sum(T), 4),
                              load_cpu=round(sum(C), 4), traced=rec["frames_traced"], loaded=rec["frames_loaded"],
                              helpers="ember.native.triton_helpers" in rec["imported_in_first_call"])))
