#!/usr/bin/python3
"""The share of an embedding table's row reads that RAM answers under each hot-set
policy, simulated over Criteo-format click data (the CTR generator's, Zipf).

    build/bin/ctr_datagen --train_file=/tmp/ctr_train.tsv --test_file=/tmp/ctr_test.tsv
    head -100000 /tmp/ctr_train.tsv > /tmp/ctr_100k.tsv
    /usr/bin/python3 benchmarks/hot_set.py /tmp/ctr_100k.tsv \\
        lru,sampled_lru,sampled_lfu,lfu,opt 0.05,0.10,0.25

Per SYNC step (2 workers x 256 examples) the step's unique (field, value)
rows are read: a row RAM holds is a hit, a row seen before that RAM does not
hold is a disk read; new rows are neither. After the step every row of it is
in RAM (as EmbeddingTable::Admit leaves them; sampled LFU's new rows only
while there is room), and the policy takes rows out
down to the capacity (a share of the rows seen), never one of the step's:
exact LRU, sampled LRU (the oldest of 8 drawn, as the PS's), sampled LFU
(the fewest updates of 8 drawn, oldest on ties; a new row takes only the
room left once the step's other rows are in, and goes to disk otherwise:
storage.hot_set's LFU),
exact LFU (counts over the whole run), and opt, Belady's clairvoyant
policy (the rows read again latest, or never, go first): no policy that
does not know the future reads fewer rows from disk. Prints one line per
capacity."""
import collections, heapq, random, sys
lines = open(sys.argv[1]).read().split("\n")
B = 512
steps = []
for i in range(0, len(lines), B):
    keys = set()
    for line in lines[i:i + B]:
        cols = line.split("\t")
        if len(cols) < 40: continue
        for f, v in enumerate(cols[14:40]):
            if v: keys.add((f, v))
    steps.append(list(keys))
distinct = len({k for s in steps for k in s})
# For opt: the step at which each step's rows are read next (len(steps): never).
next_read = [None] * len(steps)
upcoming = {}
for t in range(len(steps) - 1, -1, -1):
    next_read[t] = [upcoming.get(k, len(steps)) for k in steps[t]]
    for k in steps[t]:
        upcoming[k] = t
reads = sum(len(s) for s in steps)
print(f"{len(steps)} steps, {reads} row reads, {distinct} distinct rows", flush=True)

def run(policy, cap, seed=1):
    rng = random.Random(seed)
    held = collections.OrderedDict()  # key -> last step touched, oldest first
    freq = collections.Counter()
    heap = []                          # LFU: (freq, last, key); opt: (-next read, key); lazily invalid
    due = {}                           # opt: key -> the step that reads it next
    rows, pos = [], {}                 # sampled LRU: dense rows
    seen = set()
    hits = misses = 0
    for t, keys in enumerate(steps):
        for k in keys:
            if k in held: hits += 1
            elif k in seen: misses += 1
        # Under the PS's LFU a new row takes only the room RAM has left once
        # the step's other rows are in; the rest go to disk.
        new_rows = {k for k in keys if k not in seen} if policy == "sampled_lfu" else set()
        for k in keys:
            seen.add(k); freq[k] += 1
            if k in new_rows:
                continue
            if k not in held:
                pos[k] = len(rows); rows.append(k)
            held[k] = t; held.move_to_end(k)
            if policy == "lfu": heapq.heappush(heap, (freq[k], t, k))
        if policy == "opt":
            for k, n in zip(keys, next_read[t]):
                due[k] = n
                heapq.heappush(heap, (-n, k))
        excess = len(held) - cap
        victims = []
        if excess > 0 and policy == "lru":
            for k, v in held.items():
                if len(victims) == excess or v == t: break
                victims.append(k)
        elif excess > 0 and policy == "lfu":
            # Least frequently read (over the whole run), oldest first on ties;
            # entries of this step's rows go back once the victims are found.
            kept = []
            while len(victims) < excess and heap:
                entry = heapq.heappop(heap)
                f, v, k = entry
                if k not in held or held[k] != v or freq[k] != f:
                    continue  # stale: the row was read again, or left
                if v == t:
                    kept.append(entry)
                else:
                    victims.append(k)
            for entry in kept:
                heapq.heappush(heap, entry)
        elif excess > 0 and policy == "opt":
            # Read again latest first; none of this step's rows (each is due
            # after t, so an entry of one is valid and goes back).
            kept = []
            while len(victims) < excess and heap:
                entry = heapq.heappop(heap)
                n, k = -entry[0], entry[1]
                if k not in held or due[k] != n:
                    continue  # stale: the row was read since, or left
                if held[k] == t:
                    kept.append(entry)
                else:
                    victims.append(k)
            for entry in kept:
                heapq.heappush(heap, entry)
        elif excess > 0:
            # Sampled, as EmbeddingTable::Admit: of 8 drawn (4 rounds), the
            # oldest (LRU), or the fewest updates, oldest first on ties (LFU:
            # the row's own update count, which the PS keeps in both tiers).
            if policy == "sampled_lfu":
                rank = lambda k: (freq[k], held[k])  # noqa: E731
            else:
                rank = lambda k: held[k]  # noqa: E731
            chosen = set()
            while len(victims) < excess:
                best = None
                for r in range(4):
                    for _ in range(8):
                        k = rows[rng.randrange(len(rows))]
                        if held[k] < t and k not in chosen and (best is None or rank(k) < rank(best)):
                            best = k
                    if best is not None: break
                if best is None:
                    best = next(k for k in rows if held[k] < t and k not in chosen)
                chosen.add(best); victims.append(best)
        for k in victims:
            del held[k]
            i = pos.pop(k); last = rows.pop()
            if last != k: rows[i] = last; pos[last] = i
        for k in (k for k in keys if k in new_rows):
            if len(held) >= cap: break
            pos[k] = len(rows); rows.append(k)
            held[k] = t; held.move_to_end(k)
        assert len(held) <= max(cap, len(keys)), (policy, len(held), cap)
    return hits, misses

for frac in [float(f) for f in sys.argv[3].split(",")]:
    cap = int(distinct * frac)
    out = []
    for policy in sys.argv[2].split(","):
        h, m = run(policy, cap)
        out.append(f"{policy} {100.0 * h / (h + m):.1f}% ({m} disk reads)")
    print(f"RAM {frac:.0%} of rows ({cap}): " + ", ".join(out), flush=True)
