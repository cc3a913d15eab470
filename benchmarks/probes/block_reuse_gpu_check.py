"""Device check (session 42): ember with block reuse on CUDA against eager, tiny HF Llama and GPT-2, train and infer."""
import sys, json, collections, torch, ember
from ember.aot import blocks
import transformers as T
res = {}
def run(name, make, ids):
    for train in (False, True):
        torch.manual_seed(0); m = make().cuda(); m.train(train)
        torch.manual_seed(0); m2 = make().cuda(); m2.train(train); m2.load_state_dict(m.state_dict())
        before = collections.Counter(blocks.STATS)
        cm = ember.compile(m)
        if train:
            torch.manual_seed(1); l1 = cm(ids, labels=ids).loss; l1.backward()
            torch.manual_seed(1); l2 = m2(ids, labels=ids).loss; l2.backward()
            gd = max((a.grad - b.grad).abs().max().item() for a, b in zip(m.parameters(), m2.parameters()) if a.grad is not None)
            res[f"{name}_train"] = dict(loss=(l1 - l2).abs().item(), grad=gd, stats=dict(collections.Counter(blocks.STATS) - before))
        else:
            with torch.no_grad():
                o1 = cm(ids).logits; o2 = m2(ids).logits
            res[f"{name}_infer"] = dict(out=(o1 - o2).abs().max().item(), stats=dict(collections.Counter(blocks.STATS) - before))
        ember.reset()
        print(name, train, res, flush=True)
lc = T.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128, max_position_embeddings=64); lc._attn_implementation = "sdpa"
gc = T.GPT2Config(n_embd=64, n_layer=4, n_head=4, vocab_size=128, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
ids = torch.randint(0, 128, (2, 32), device="cuda")
run("llama", lambda: T.LlamaForCausalLM(lc), ids)
run("gpt2", lambda: T.GPT2LMHeadModel(gc), ids)
if len(sys.argv) > 1:  # (the file to write the results to; they are printed either way)
    json.dump(res, open(sys.argv[1], "w"), indent=1)
