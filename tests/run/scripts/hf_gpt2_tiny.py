import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(cfg).eval()
model.forward = torch.compile(model.forward)
ids = torch.randint(0, 64, (1, 8))
with torch.no_grad():
    out = model(input_ids=ids)
print(tuple(out.logits.shape), out.logits[0, -1].argmax().item())
