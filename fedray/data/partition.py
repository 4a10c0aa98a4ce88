"""Split a train set's indices among clients: IID, label skew (Dirichlet, and Flower's
inner-Dirichlet at given sizes), pathological classes per client, McMahan et al.'s label-sorted
shards, quantity skew, and Flower Datasets' deterministic size partitions (linear, square,
exponential).

Every partitioner returns one sorted int64 index array per client; the arrays are disjoint
and together hold every sample. Randomness comes only from the ``np.random.Generator``
passed in. The work is vectorised: each sample gets a client id, and one stable argsort
groups the ids, so 100,000 labels over 1,000 clients take milliseconds.
"""

from __future__ import annotations

import numpy as np

SCHEMES = ("iid", "dirichlet", "pathological", "shard", "inner_dirichlet", "quantity", "linear",
           "square", "exponential")
INNER_SIZES = ("equal", "quantity", "linear", "square", "exponential")
SIZE_UNITS = {"linear": lambda k: k, "square": lambda k: k ** 2,
              "exponential": lambda k: np.exp(k - k.max())}
MAX_DIRICHLET_TRIES = 100


class PartitionError(ValueError):
    """A partition request that cannot be met.

    ``param`` names the argument most responsible (``num_clients``, ``min_size``, ``alpha``,
    ``classes_per_client``, ``quantity_alpha``) and ``allowed`` says what would work, so
    callers can turn this into a config error on the matching field.
    """

    def __init__(self, message: str, param: str | None = None, value: object = None,
                 allowed: str | None = None):
        super().__init__(message)
        self.param, self.value, self.allowed = param, value, allowed


def _group(client_of: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Per-client sorted index arrays from a per-sample client id (``client_of[i]``)."""
    order = np.argsort(client_of, kind="stable").astype(np.int64)
    sizes = np.bincount(client_of, minlength=num_clients)
    return np.split(order, np.cumsum(sizes)[:-1])


def _check_clients(n: int, num_clients: int, min_size: int = 1) -> None:
    if num_clients < 1:
        raise PartitionError(f"num_clients must be >= 1, got {num_clients}",
                             "num_clients", num_clients, "at least 1")
    if min_size < 0:
        raise PartitionError(f"min_size must be >= 0, got {min_size}",
                             "min_size", min_size, "at least 0")
    floor = max(min_size, 1)
    if num_clients * floor > n:
        if n < num_clients:
            raise PartitionError(
                f"{num_clients} clients but only {n} samples: every client needs at least "
                f"one sample", "num_clients", num_clients, f"at most {n} clients")
        raise PartitionError(
            f"{num_clients} clients x min_size {min_size} = {num_clients * min_size} samples "
            f"needed but only {n} available", "min_size", min_size,
            f"at most {n // num_clients} for {num_clients} clients and {n} samples")


def _grouped_by_class(labels: np.ndarray, gen: np.random.Generator
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Sample ids shuffled within their class and grouped by class, plus the class sizes."""
    perm = gen.permutation(len(labels))
    grouped = perm[np.argsort(labels[perm], kind="stable")]
    counts = np.bincount(labels, minlength=int(labels.max()) + 1 if len(labels) else 0)
    return grouped, counts


def _dense_labels(labels: np.ndarray) -> np.ndarray:
    """Labels re-coded to 0..C-1 over the classes actually present."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise PartitionError(f"labels must be 1-D, got shape {labels.shape}")
    return np.unique(labels, return_inverse=True)[1].astype(np.int64).reshape(-1)


def iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A uniformly random split into ``num_clients`` shards whose sizes differ by at most 1."""
    _check_clients(n, num_clients)
    client_of = np.empty(n, dtype=np.int64)
    client_of[rng.permutation(n)] = np.arange(n) % num_clients
    return _group(client_of, num_clients)


def dirichlet(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator,
              min_size: int = 2) -> list[np.ndarray]:
    """Label skew: each class is divided among clients in proportions ~ Dir(alpha).

    Small ``alpha`` concentrates each class on few clients; large ``alpha`` approaches IID.
    Draws are repeated (at most ``MAX_DIRICHLET_TRIES`` times) until every client holds at
    least ``min_size`` samples.
    """
    labels = _dense_labels(labels)
    n = len(labels)
    _check_clients(n, num_clients, min_size)
    if not alpha > 0:
        raise PartitionError(f"alpha must be > 0, got {alpha}", "alpha", alpha, "a number > 0")
    grouped, class_sizes = _grouped_by_class(labels, rng)
    num_classes = len(class_sizes)
    smallest = 0
    for _ in range(MAX_DIRICHLET_TRIES):
        props = rng.dirichlet(np.full(num_clients, alpha), size=num_classes)
        props = np.nan_to_num(props, nan=0.0)
        cuts = np.rint(np.cumsum(props, axis=1) * class_sizes[:, None]).astype(np.int64)
        cuts = np.minimum(cuts, class_sizes[:, None])
        cuts[:, -1] = class_sizes
        counts = np.diff(cuts, axis=1, prepend=0)  # (classes, clients)
        sizes = counts.sum(axis=0)
        smallest = int(sizes.min())
        if smallest >= min_size:
            owner = np.repeat(np.tile(np.arange(num_clients), num_classes), counts.ravel())
            client_of = np.empty(n, dtype=np.int64)
            client_of[grouped] = owner
            return _group(client_of, num_clients)
    raise PartitionError(
        f"Dirichlet(alpha={alpha}) label split of {n} samples over {num_clients} clients left "
        f"a client with {smallest} < min_size {min_size} samples in all "
        f"{MAX_DIRICHLET_TRIES} draws", "alpha", alpha,
        "a larger alpha (or fewer clients / a smaller minimum size)")


def pathological(labels: np.ndarray, num_clients: int, classes_per_client: int,
                 rng: np.random.Generator) -> list[np.ndarray]:
    """Pathological label skew: each client holds samples of ``classes_per_client`` classes.

    Every class is given to at least one client (the first clients in a random order cover
    all classes, the remaining slots pick classes at random); each class's samples are then
    dealt evenly among the clients holding it, the remainder going to the holders with the
    fewest samples so far. A client can end up with fewer classes only if a class has fewer
    samples than holders.
    """
    labels = _dense_labels(labels)
    n = len(labels)
    _check_clients(n, num_clients)
    grouped, class_sizes = _grouped_by_class(labels, rng)
    num_classes = len(class_sizes)
    if not 1 <= classes_per_client <= num_classes:
        raise PartitionError(
            f"classes_per_client must be in 1..{num_classes} (the classes present), got "
            f"{classes_per_client}", "classes_per_client", classes_per_client,
            f"1..{num_classes}")
    if num_clients * classes_per_client < num_classes:
        need = -(-num_classes // num_clients)
        raise PartitionError(
            f"{num_clients} clients x {classes_per_client} classes cannot cover all "
            f"{num_classes} classes", "classes_per_client", classes_per_client,
            f"at least {need} for {num_clients} clients and {num_classes} classes")
    # Random keys per (client, class); covering slots get key -1 so they are picked first.
    keys = rng.random((num_clients, num_classes))
    cover_clients = rng.permutation(num_clients)[np.arange(num_classes) // classes_per_client]
    keys[cover_clients, rng.permutation(num_classes)] = -1.0
    chosen = np.argsort(keys, axis=1)[:, :classes_per_client]
    holds = np.zeros((num_classes, num_clients), dtype=bool)
    holds[chosen, np.arange(num_clients)[:, None]] = True
    # Deal each class among its holders: an equal share each, and the remainder to the
    # holders with the fewest samples so far (random tie-break), so small classes do not
    # always land on the same clients.
    counts = np.zeros((num_classes, num_clients), dtype=np.int64)
    total = np.zeros(num_clients, dtype=np.int64)
    tie = rng.random(num_clients)
    for c in rng.permutation(num_classes):
        who = np.flatnonzero(holds[c])
        base, extra = divmod(int(class_sizes[c]), who.size)
        counts[c, who] = base
        if extra:
            first = who[np.lexsort((tie[who], total[who]))[:extra]]
            counts[c, first] += 1
        total += counts[c]
    owner = np.repeat(np.tile(np.arange(num_clients), num_classes), counts.ravel())
    client_of = np.empty(n, dtype=np.int64)
    client_of[grouped] = owner
    return _group(client_of, num_clients)


def shard(labels: np.ndarray, num_clients: int, shards_per_client: int,
          rng: np.random.Generator) -> list[np.ndarray]:
    """McMahan et al. (AISTATS 2017)'s pathological non-IID split — Flower Datasets'
    ``ShardPartitioner`` given ``num_shards_per_partition``: the samples sorted by label
    (ties in a seeded random order), cut into N·s shards of consecutive samples, and each
    client dealt s shards at random. Shards are ⌊n / (N s)⌋ samples and the first n mod N·s
    of them one more, so every sample is held (Flower drops that remainder; with MNIST's
    60,000 samples, 100 clients and s = 2 both are the paper's 200 shards of 300)."""
    labels = _dense_labels(labels)
    n = len(labels)
    _check_clients(n, num_clients)
    total = num_clients * shards_per_client
    if not 1 <= shards_per_client or total > n:
        raise PartitionError(
            f"{num_clients} clients x {shards_per_client} shards need at least one sample per "
            f"shard ({n} samples)", "shards_per_client", shards_per_client,
            f"1..{max(1, n // num_clients)}")
    order = np.lexsort((rng.random(n), labels))
    base, extra = divmod(n, total)
    sizes = np.full(total, base, dtype=np.int64)
    sizes[:extra] += 1
    shard_of = np.repeat(np.arange(total), sizes)
    owner_of_shard = np.empty(total, dtype=np.int64)
    owner_of_shard[rng.permutation(total)] = np.arange(total) % num_clients
    client_of = np.empty(n, dtype=np.int64)
    client_of[order] = owner_of_shard[shard_of]
    return _group(client_of, num_clients)


def inner_dirichlet(labels: np.ndarray, sizes: np.ndarray, alpha: float,
                    rng: np.random.Generator) -> list[np.ndarray]:
    """Flower Datasets' ``InnerDirichletPartitioner``: client i gets exactly ``sizes[i]``
    samples whose classes follow its own prior p_i ~ Dir(alpha · 1), drawn as Flower draws
    them — one sample at a time for a random client that still has room, its class from
    p_i restricted to the classes that still have samples (renormalized; a client whose
    prior has no mass left draws uniformly among them). Vectorised: the slots (client
    ids, each repeated by its size) in a seeded random order get their classes drawn at
    once; the slots before the first one that takes more of a class than is left are kept,
    that class is marked empty and the rest redrawn — at most classes + 1 passes."""
    labels = _dense_labels(labels)
    n = len(labels)
    sizes = np.asarray(sizes)
    if not np.issubdtype(sizes.dtype, np.integer) or sizes.min(initial=0) < 0 or \
            int(sizes.sum()) != n:
        raise PartitionError(f"inner_dirichlet sizes must be non-negative integers summing to "
                             f"{n}", "scheme", "inner_dirichlet", "sizes that hold every sample")
    if not alpha > 0:
        raise PartitionError(f"alpha must be > 0, got {alpha}", "alpha", alpha, "a number > 0")
    grouped, class_sizes = _grouped_by_class(labels, rng)
    num_clients, num_classes = len(sizes), len(class_sizes)
    priors = np.nan_to_num(rng.dirichlet(np.full(num_classes, alpha), size=num_clients))
    slots = rng.permutation(np.repeat(np.arange(num_clients), sizes.astype(np.int64)))
    left = class_sizes.astype(np.int64).copy()
    cls_of_slot = np.empty(n, dtype=np.int64)
    done = 0
    while done < n:
        avail = left > 0
        p = priors * avail
        mass = p.sum(axis=1, keepdims=True)
        p = np.where(mass > 0, p / np.where(mass > 0, mass, 1), avail / avail.sum())
        cdf = np.cumsum(p, axis=1)
        last = num_classes - 1 - np.argmax(p[:, ::-1] > 0, axis=1)  # no draw past it, even
        cdf[np.arange(num_classes)[None, :] >= last[:, None]] = 1.0  # where rounding left <1
        rest = slots[done:]
        u = rng.random(len(rest))
        drawn = np.empty(len(rest), dtype=np.int64)
        step = max(1, (1 << 22) // num_classes)
        for i in range(0, len(rest), step):
            c = cdf[rest[i:i + step]]
            drawn[i:i + step] = (u[i:i + step, None] >= c).sum(axis=1)
        rank = np.zeros(len(rest), dtype=np.int64)  # how many of its class drawn before it
        order = np.argsort(drawn, kind="stable")
        starts = np.searchsorted(drawn[order], np.arange(num_classes))
        rank[order] = np.arange(len(rest)) - starts[drawn[order]]
        over = np.flatnonzero(rank >= left[drawn])
        keep = over[0] if over.size else len(rest)
        cls_of_slot[done:done + keep] = drawn[:keep]
        left -= np.bincount(drawn[:keep], minlength=num_classes)
        done += keep
    counts = np.zeros((num_classes, num_clients), dtype=np.int64)
    np.add.at(counts, (cls_of_slot, slots), 1)
    owner = np.repeat(np.tile(np.arange(num_clients), num_classes), counts.ravel())
    client_of = np.empty(n, dtype=np.int64)
    client_of[grouped] = owner
    return _group(client_of, num_clients)


def quantity(n: int, num_clients: int, alpha: float, rng: np.random.Generator,
             min_size: int = 2) -> list[np.ndarray]:
    """Quantity skew: client sizes ~ ``min_size`` + Dir(alpha) shares of the rest; labels IID."""
    _check_clients(n, num_clients, min_size)
    if not alpha > 0:
        raise PartitionError(f"quantity alpha must be > 0, got {alpha}", "quantity_alpha",
                             alpha, "a number > 0")
    props = np.nan_to_num(rng.dirichlet(np.full(num_clients, alpha)), nan=0.0)
    if props.sum() <= 0:
        props = np.full(num_clients, 1.0 / num_clients)
    rest = n - num_clients * min_size
    share = props / props.sum() * rest
    sizes = np.floor(share).astype(np.int64)
    leftover = rest - int(sizes.sum())
    if leftover > 0:
        frac = share - sizes
        sizes[np.argsort(-frac, kind="stable")[:leftover]] += 1
    sizes += min_size
    client_of = np.empty(n, dtype=np.int64)
    client_of[rng.permutation(n)] = np.repeat(np.arange(num_clients), sizes)
    return _group(client_of, num_clients)


def sized(n: int, num_clients: int, kind: str, rng: np.random.Generator, min_size: int = 2
          ) -> list[np.ndarray]:
    """Flower Datasets' size partitions (``LinearPartitioner``, ``SquarePartitioner``,
    ``ExponentialPartitioner``): client i (1-based) gets units u(i) = i, i² or e^i, its size
    ⌊n · u(i) / Σ u⌋ and the samples left by the floors go to the last (largest) client, as
    Flower's ``SizePartitioner`` does; which samples a client gets is a seeded permutation
    (labels IID). e^i is computed as e^(i − M), the same shares without overflow."""
    _check_clients(n, num_clients, min_size)
    units = SIZE_UNITS[kind](np.arange(1, num_clients + 1, dtype=np.float64))
    sizes = np.floor(units / units.sum() * n).astype(np.int64)
    sizes[-1] += n - int(sizes.sum())
    if sizes.min() < min_size:
        raise PartitionError(f"{kind} sizes give client 0 only {int(sizes[0])} of {n} samples",
                             "num_clients", num_clients,
                             f"fewer clients (the smallest {kind} share of {n} samples must "
                             f"be >= {min_size})")
    client_of = np.empty(n, dtype=np.int64)
    client_of[rng.permutation(n)] = np.repeat(np.arange(num_clients), sizes)
    return _group(client_of, num_clients)


def partition(labels: np.ndarray, num_clients: int, scheme: str, rng: np.random.Generator, *,
              alpha: float = 0.5, classes_per_client: int = 2, quantity_alpha: float = 0.5,
              min_size: int = 2, shards_per_client: int = 2, inner_sizes: str = "equal"
              ) -> list[np.ndarray]:
    """Split ``range(len(labels))`` among ``num_clients`` clients with ``scheme``.

    Every client is guaranteed at least ``min_size`` samples, or :class:`PartitionError`
    says which argument to change.
    """
    labels = np.asarray(labels)
    n = len(labels)
    _check_clients(n, num_clients, min_size)
    if scheme == "iid":
        parts = iid(n, num_clients, rng)
    elif scheme == "dirichlet":
        parts = dirichlet(labels, num_clients, alpha, rng, min_size)
    elif scheme == "pathological":
        parts = pathological(labels, num_clients, classes_per_client, rng)
    elif scheme == "shard":
        parts = shard(labels, num_clients, shards_per_client, rng)
    elif scheme == "inner_dirichlet":
        if inner_sizes == "equal":
            sizes = np.full(num_clients, n // num_clients, dtype=np.int64)
            sizes[:n % num_clients] += 1
        else:
            sizes = np.array([len(p) for p in partition(
                labels, num_clients, inner_sizes, rng,
                quantity_alpha=quantity_alpha, min_size=min_size)], dtype=np.int64)
        parts = inner_dirichlet(labels, sizes, alpha, rng)
    elif scheme == "quantity":
        parts = quantity(n, num_clients, quantity_alpha, rng, min_size)
    elif scheme in SIZE_UNITS:
        parts = sized(n, num_clients, scheme, rng, min_size)
    else:
        raise PartitionError(f"unknown partition scheme {scheme!r}; known: {SCHEMES}",
                             "scheme", scheme, ", ".join(SCHEMES))
    smallest = min(len(p) for p in parts)
    if smallest < min_size:
        raise PartitionError(
            f"{scheme} partition of {n} samples over {num_clients} clients gave a client "
            f"{smallest} < min_size {min_size} samples", "num_clients", num_clients,
            "fewer clients (or more classes per client / a smaller minimum size)")
    return parts
