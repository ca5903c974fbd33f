"""Plain per-row Python references for hfbridge.processors: one row, lists and loops, float64.

Written from llama.cpp's algorithms (src/llama-sampler.cpp) step by step, without any of the
vectorised tricks of the package (no hashing, no topk): they share nothing with the code they check.
"""

from __future__ import annotations

import math
from collections import Counter

NEG_INF = float("-inf")


def dry(tokens, scores, *, multiplier, base, allowed, last_n, breakers):
    """`breakers`: list of (head, tail tuple). Returns the new scores (list of floats)."""
    out = list(scores)
    if multiplier == 0 or last_n == 0:
        return out
    window = list(tokens) if last_n == -1 else list(tokens)[-last_n:] if last_n > 0 else []
    m = len(window)
    if m <= allowed:
        return out

    def back(i):  # llama.cpp's rat(i): i tokens before the end
        return window[m - 1 - i]

    rep_limit = m
    for i in range(m):
        longest = -1
        for head, tail in breakers:
            if head == back(i) and longest < len(tail) <= i and all(
                tail[k] == back(i - k - 1) for k in range(len(tail))
            ):
                longest = len(tail)
        if longest >= 0:
            rep_limit = i - longest
            break
    if rep_limit < allowed:
        return out
    repeat = [0] * m  # naive: for each shift k, the common length of the ending and the ending k earlier
    for k in range(1, m):
        n = 0
        while n + k < m and back(n) == back(n + k):
            n += 1
        repeat[m - 1 - k] = min(n, rep_limit)
    best = {}
    for j in range(m - 1):
        if repeat[j] >= allowed:
            token = window[j + 1]
            best[token] = max(best.get(token, 0), repeat[j])
    singles = {head for head, tail in breakers if not tail}
    max_exponent = int(88.7228391 / math.log(base)) if base > 1.000001 else 0
    for token, length in best.items():
        if token in singles:
            continue
        exponent = length - allowed
        if max_exponent > 0 and exponent > max_exponent:
            exponent = max_exponent
        out[token] = out[token] - multiplier * base ** exponent
    return out


def softmax(scores):
    finite = [s for s in scores if s != NEG_INF]
    best = max(finite)
    weights = [math.exp(s - best) if s != NEG_INF else 0.0 for s in scores]
    total = sum(weights)
    return [w / total for w in weights]


def xtc(scores, *, threshold, applies, min_keep=1):
    """The kept scores; ties in score keep the highest id (sorted by score desc, then id asc)."""
    out = list(scores)
    if not applies:
        return out
    probs = softmax(scores)
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    order = [i for i in order if scores[i] != NEG_INF]
    above = [i for i in order if probs[i] >= threshold]
    if len(above) < 2 or len(order) - (len(above) - 1) < min_keep:
        return out
    for i in above[:-1]:
        out[i] = NEG_INF
    return out


def top_n_sigma(scores, n):
    finite = [s for s in scores if s != NEG_INF]
    mean = sum(finite) / len(finite)
    sigma = math.sqrt(sum((s - mean) ** 2 for s in finite) / len(finite))
    floor = max(finite) - n * sigma
    return [s if s >= floor else NEG_INF for s in scores], floor


def penalties(tokens, scores, *, presence, frequency, repeat=1.0):
    out = list(scores)
    for token, count in Counter(tokens).items():
        value = out[token]
        value = value * repeat if value <= 0 else value / repeat
        out[token] = value - (count * frequency + presence)
    return out


def dynamic_temperature(scores, *, temperature, spread, exponent):
    finite = [s for s in scores if s != NEG_INF]
    if len(finite) <= 1:
        return list(scores)
    if spread <= 0:
        t = temperature
    else:
        probs = softmax(scores)
        entropy = -sum(p * math.log(p) for p in probs if p > 0)
        low, high = max(0.0, temperature - spread), temperature + spread
        t = low + (high - low) * (entropy / math.log(len(finite))) ** exponent
    if t <= 0:
        best = scores.index(max(finite))
        return [s if i == best else NEG_INF for i, s in enumerate(scores)]
    return [s / t for s in scores]


def smoothing(scores, *, factor, curve):
    if factor == 0:
        return list(scores)
    best = max(scores)
    k, s = (3 - curve) / 2, (curve - 1) / 2
    return [x if x == NEG_INF else -(k * factor * (x - best) ** 2) + s * factor * (x - best) ** 3 + best
            for x in scores]


def mirostat_keep(scores, mu):
    """Kept token ids for one step (surprise <= mu; the best one at least) and their renormalised probs."""
    probs = softmax(scores)
    kept = [i for i, p in enumerate(probs) if p > 0 and -math.log2(p) <= mu]
    if not kept:
        best = max(probs)
        kept = [i for i, p in enumerate(probs) if p == best]
    total = sum(probs[i] for i in kept)
    return kept, {i: probs[i] / total for i in kept}
