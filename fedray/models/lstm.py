"""LSTM classifier that reads an input as a sequence of feature vectors."""

from __future__ import annotations

import math

import torch
from torch import nn


def sequence_shape(input_shape: tuple[int, ...], seq_len: int | None) -> tuple[int, int]:
    """``(steps, features)`` an input is read as: image rows, ``(T, F)`` or a split flat vector."""
    shape = tuple(int(d) for d in input_shape)
    if len(shape) == 3:
        c, h, w = shape
        return h, c * w
    if len(shape) == 2:
        return shape  # type: ignore[return-value]
    if len(shape) == 1:
        (d,) = shape
        if seq_len is None:
            if math.isqrt(d) ** 2 != d:
                raise ValueError(f"lstm: flat input size {d} is not a perfect square; "
                                 "set model.seq_len to a divisor of it")
            seq_len = math.isqrt(d)
        if seq_len < 1 or d % seq_len:
            raise ValueError(f"lstm: seq_len={seq_len} does not divide the input size {d}")
        return seq_len, d // seq_len
    raise ValueError(f"lstm needs an input of shape (C, H, W), (T, F) or (D,); got {shape}")


class LSTMClassifier(nn.Module):
    """LSTM over ``steps`` vectors of ``features``; a Linear classifies the last hidden state."""

    def __init__(self, input_shape: tuple[int, ...], steps: int, features: int, hidden: int,
                 layers: int, num_classes: int):
        super().__init__()
        self.image_input = len(input_shape) == 3
        self.steps, self.features = steps, features
        self.lstm = nn.LSTM(features, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.image_input:  # (B, C, H, W) -> (B, H, C, W): one step per image row
            x = x.permute(0, 2, 1, 3)
        x = x.reshape(x.shape[0], self.steps, self.features)
        return self.head(self._run(x)[:, -1])

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        """Every step's top hidden state of :attr:`lstm`: ``nn.LSTM``, or under a batching
        transform its equations written out (:meth:`_cells`)."""
        return self._cells(x) if _batched(x) else self.lstm(x)[0]

    def _cells(self, x: torch.Tensor) -> torch.Tensor:
        """Every step's top hidden state of :attr:`lstm` written out cell by cell (PyTorch's
        equations and gate order i, f, g, o, with its own weights): what a batched call over
        stacked parameters (:mod:`fedray.models.cohort`) runs, since ``nn.LSTM`` has no
        batching rule and would loop client by client. Equal to ``nn.LSTM`` up to float
        rounding."""
        seq = x
        for layer in range(self.lstm.num_layers):
            w_ih, w_hh, b_ih, b_hh = (getattr(self.lstm, f"{name}_l{layer}") for name in
                                      ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
            h = seq.new_zeros(seq.shape[0], self.lstm.hidden_size)
            c = torch.zeros_like(h)
            outs = []
            for t in range(seq.shape[1]):
                gates = seq[:, t] @ w_ih.T + b_ih + h @ w_hh.T + b_hh
                i, f, g, o = gates.chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                outs.append(h)
            seq = torch.stack(outs, dim=1)
        return seq


def _batched(x: torch.Tensor) -> bool:
    """Whether ``x`` is batched by ``torch.func.vmap`` at some level of its functorch
    wrappers (a cohort's forward pass, where ``vmap`` wraps ``grad``)."""
    f = getattr(torch._C, "_functorch", None)
    if f is None:
        return False
    while f.is_functorch_wrapped_tensor(x):
        if f.is_batchedtensor(x):
            return True
        x = f.get_unwrapped(x)
    return False


def lstm(input_shape: tuple[int, ...], num_classes: int, *, hidden: int = 64, layers: int = 1,
         seq_len: int | None = None) -> nn.Module:
    """LSTM sequence classifier: image rows, (T, F) steps, or a flat vector split in seq_len."""
    steps, features = sequence_shape(input_shape, seq_len)
    return LSTMClassifier(tuple(input_shape), steps, features, hidden, layers, num_classes)


class CharLSTM(LSTMClassifier):
    """Next-character model: token ids (stored as floats, one per step) through an
    embedding, the stacked LSTM of :class:`LSTMClassifier`, a Linear on the last step."""

    def __init__(self, steps: int, vocab: int, embed: int, hidden: int, layers: int,
                 num_classes: int):
        super().__init__((steps,), steps, embed, hidden, layers, num_classes)
        self.embed = nn.Embedding(vocab, embed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = self.embed(x.reshape(x.shape[0], self.steps).long())
        return self.head(self._run(seq)[:, -1])


def char_lstm(input_shape: tuple[int, ...], num_classes: int, *, vocab: int | None = None,
              embed: int = 8, hidden: int = 256, layers: int = 2) -> nn.Module:
    """LEAF's Shakespeare next-character LSTM (``models/shakespeare/stacked_lstm.py``: an
    8-wide embedding, two LSTM layers of 256, a dense layer on the last step) over inputs of
    token ids in [0, vocab), one step per input value (any shape, read flat); ``vocab``
    defaults to ``num_classes`` (LEAF: 80 letters). PyTorch's LSTM has two bias vectors per
    layer where TensorFlow's has one, so at LEAF's sizes it has 819,920 parameters to LEAF's
    817,872 (2 × 4 × 256 more)."""
    return CharLSTM(math.prod(int(d) for d in input_shape), vocab or num_classes, embed,
                    hidden, layers, num_classes)


char_lstm.token_ids = True  # its inputs are token ids, not features


class Sent140LSTM(LSTMClassifier):
    """A sentence classifier over word ids (stored as floats, one per step): an embedding,
    the stacked LSTM of :class:`LSTMClassifier`, a linear layer on the last step (no
    activation, as LEAF's ``fc1``) and a Linear to the classes. An id at or above
    ``vocab - 1`` reads the last embedding row, the unknown word's: a model with a smaller
    table than the data's vocabulary treats the rarer words as unknown."""

    def __init__(self, steps: int, vocab: int, embed: int, hidden: int, layers: int,
                 dense: int, num_classes: int):
        super().__init__((steps,), steps, embed, hidden, layers, num_classes)
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, embed)
        self.dense = nn.Linear(hidden, dense)
        self.head = nn.Linear(dense, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = x.reshape(x.shape[0], self.steps).long().clamp(0, self.vocab - 1)
        return self.head(self.dense(self._run(self.embed(ids))[:, -1]))


def sent140_lstm(input_shape: tuple[int, ...], num_classes: int, *, vocab: int = 10_001,
                 embed: int = 100, hidden: int = 100, layers: int = 2, dense: int = 128
                 ) -> nn.Module:
    """LEAF's Sent140 model (``models/sent140/stacked_lstm.py``): a trainable, randomly
    initialised embedding of ``n_hidden`` = 100 per word id (LEAF accepts GloVe vectors but
    never loads them), two LSTM layers of 100, a linear layer of 128 on the last step, the
    classes. ``vocab`` = the data's vocabulary + 1 (the unknown/pad id LEAF gives every
    other word and the padding): 10,001 for ``data.vocab_size`` = 10,000; LEAF's GloVe
    vocabulary is 400,001 (40,174,086 parameters in TensorFlow, + 2 × 4 × 100 for
    PyTorch's second LSTM biases)."""
    return Sent140LSTM(math.prod(int(d) for d in input_shape), vocab, embed, hidden, layers,
                       dense, num_classes)


sent140_lstm.token_ids = True


class NextTokenLSTM(LSTMClassifier):
    """A language model over token ids (stored as floats, one per step): an embedding, the
    stacked LSTM of :class:`LSTMClassifier`, an optional projection, and a Linear scoring
    the next token at every step. The logits are ``(B, vocab, steps)`` — classes second, as
    ``nn.CrossEntropyLoss`` takes per-token targets ``(B, steps)``, whose padded targets
    (``-100``, its ``ignore_index``) drop out of the loss.

    ``unscored_targets`` are the ids its headline accuracy leaves out besides padding:
    for StackOverflow (``word_lstm``) TFF's ``accuracy_no_oov_no_eos`` drops the OOV bucket
    and EOS (in TFF's layout — pad 0, the vocabulary 1..V, one OOV bucket V+1, BOS V+2, EOS
    V+3 — the ids V+1 and V+3; BOS is never a target); TFF's Shakespeare accuracy masks only
    padding (``next_char_lstm``: none). See :mod:`fedray.data.tff`."""

    def __init__(self, steps: int, vocab: int, embed: int, hidden: int, layers: int,
                 project: int | None, unscored_targets: tuple[int, ...] = ()):
        super().__init__((steps,), steps, embed, hidden, layers, vocab)
        self.embed = nn.Embedding(vocab, embed)
        self.project = nn.Linear(hidden, project) if project else None
        if project:
            self.head = nn.Linear(project, vocab)
        self.unscored_targets = unscored_targets

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self._run(self.embed(x.reshape(x.shape[0], self.steps).long()))
        if self.project is not None:
            h = self.project(h)
        return self.head(h).transpose(1, 2)


def word_lstm(input_shape: tuple[int, ...], num_classes: int, *, embed: int = 96,
              hidden: int = 670, layers: int = 1, project: int = 96) -> nn.Module:
    """TFF's StackOverflow next-word LSTM (``create_recurrent_model``: a 96-wide embedding,
    one LSTM of 670, a dense layer to 96, a dense layer to the 10,004 ids of a 10,000-word
    vocabulary with one OOV bucket, BOS and EOS) scoring every step. 4,050,748 parameters in
    Keras; PyTorch's second LSTM bias adds 4 × 670 = 2,680 (4,053,428)."""
    oov, eos = num_classes - 3, num_classes - 1  # TFF's layout with one OOV bucket
    return NextTokenLSTM(math.prod(int(d) for d in input_shape), num_classes, embed, hidden,
                         layers, project or None, (oov, eos) if num_classes > 3 else ())


def next_char_lstm(input_shape: tuple[int, ...], num_classes: int, *, embed: int = 8,
                   hidden: int = 256, layers: int = 2) -> nn.Module:
    """TFF's Shakespeare next-character LSTM (``create_recurrent_model``: an 8-wide
    embedding, two LSTM layers of 256, a dense layer to the 90 ids of 86 characters, pad,
    OOV, BOS and EOS) scoring every step. 820,522 parameters in Keras; PyTorch's second
    LSTM biases add 2 × 4 × 256 = 2,048 (822,570)."""
    return NextTokenLSTM(math.prod(int(d) for d in input_shape), num_classes, embed, hidden,
                         layers, None)


for _builder in (word_lstm, next_char_lstm):
    _builder.token_ids = True
    _builder.per_token = True  # logits (B, classes, steps) for targets (B, steps)
