"""The small transformer of the GPU training parity test (gpu_training_worker.py), also used by
scripts/diag/sdp_fsdp_probe.py."""
import torch.nn as nn

VOCAB, DIM = 256, 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        layer = nn.TransformerEncoderLayer(DIM, 4, 128, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)))
