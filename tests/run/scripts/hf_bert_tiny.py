import torch
from transformers import BertConfig, BertModel

torch.manual_seed(0)
cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=32)
model = BertModel(cfg).eval()
cmodel = torch.compile(model, dynamic=False)
ids = torch.randint(0, 100, (2, 6))
mask = torch.ones_like(ids)
with torch.no_grad():
    out = cmodel(input_ids=ids, attention_mask=mask)
print(tuple(out.last_hidden_state.shape), round(out.pooler_output.abs().sum().item(), 2))
