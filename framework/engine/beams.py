"""Beam search (`SamplingParams.beam_width`): a request's beams as the samples of one group,
over shared blocks, the next tokens chosen on the host each round.

A request of width W runs W sequences (`framework.core.sample_group`), forked over its
prompt as parallel samples are. Each step a beam computes one token as any greedy row
does, and its log-probabilities with the 2W most likely next tokens (`engine.scores`). A
round ends when every live beam has such a token: the W best continuations of all beams by
cumulative log-probability (the first round from the first beam alone, all beams being the
same) become the beams, as Hugging Face's `generate(num_beams=W)` chooses them. A beam that
continues another's hypothesis takes that beam's tokens and its blocks, whose reference
counts go up (`BlockPool.retable`); the block both will write next is copied by the first
to write it (`copy_on_write`, before the step's forward). A continuation that ends with a
stop token is a finished hypothesis; the request ends when its length runs out, or when W
finished hypotheses are all better than any live beam could become (`early_stopping=False`'s
rule). Then beam k holds the k-th best hypothesis by cumulative log-probability over length
** `length_penalty`, and every beam finishes.

A beam with its token of a round is ahead: it sits the next steps out until the others
have theirs (a beam behind was preempted, or admitted later). So a round never mixes
lengths. Tokens kept and then dropped (hypotheses that ended before the others, the
continuations not chosen at the end) are counted as `pruned_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from framework.core.sequence import SampleGroup, Sequence, Status
from framework.core.token_logprob import TokenLogprob
from framework.engine.block_pool import BlockPool
from framework.engine.counters import Counters
from framework.engine.invariants import InvariantError
from framework.engine.kv_usage import overhang


@dataclass
class Hypothesis:
    score: float  # cumulative log-probability over length ** length_penalty
    tokens: list[int]
    entries: list[TokenLogprob | None]


@dataclass
class BeamState:
    """One request's search: the tokens decided so far (each beam's first `decided`), each
    beam's cumulative log-probability over them, and the hypotheses finished."""

    group: SampleGroup
    width: int
    decided: int = 0
    cum: list[float] = field(default_factory=list)
    finished: list[Hypothesis] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cum = [0.0] * self.width


def _admitted(group: SampleGroup) -> int:
    """When a search first had a beam admitted (a search none of whose beams ran: last)."""
    orders = [s.admit_order for s in group.members if s.admit_order >= 0]
    return min(orders) if orders else 1 << 62


class Beams:
    """The beam searches running here (the planner's): which rows sit a step out, and each
    round's choice once its beams' tokens are home."""

    def __init__(self, pool: BlockPool, counters: Counters) -> None:
        self.pool = pool
        self.counters = counters
        self.searches: dict[SampleGroup, BeamState] = {}
        self.copies: list[tuple[int, int]] = []  # this step's copies on write

    def __bool__(self) -> bool:
        return bool(self.searches)

    def add(self, group: SampleGroup) -> None:
        """`group` searches if its request asks for beams (else it is parallel samples)."""
        if (width := group.request.sampling.beam_width) > 1:
            self.searches[group] = BeamState(group, width)

    @staticmethod
    def stops(seq: Sequence) -> frozenset[int]:
        """A beam's stop tokens: the search ends hypotheses on them, the engine never does
        (`Sequence.stop_ids` is empty for a beam until it finishes)."""
        sp = seq.sampling
        ids = set(sp.stop_token_ids)
        if not sp.ignore_eos and seq.eos_token_id is not None:
            ids.add(seq.eos_token_id)
        return frozenset(ids)

    def ahead(self, seq: Sequence) -> bool:
        """`seq` is a beam with its token of this round already (home or on the device)."""
        group = seq.group
        if group is None or seq.finished:
            return False
        state = self.searches.get(group)
        return state is not None and len(seq.output_token_ids) + seq.num_held > state.decided

    def preempted(self, seq: Sequence) -> None:
        """A beam leaves the rows, its KV dropped: its token of this round, not chosen from
        yet, is dropped too (counted as pruned) and computed again when it is readmitted."""
        state = self.searches.get(seq.group) if seq.group is not None else None
        if state is None or (extra := len(seq.output_token_ids) - state.decided) <= 0:
            return
        d = state.decided
        del seq.output_token_ids[d:], seq.output_logprobs[d:], seq.token_times[d:]
        self.counters.pruned_tokens += extra

    def stalled(self, running: list[Sequence], cap: int) -> tuple[Sequence, list[Sequence]] | None:
        """A beam waiting to rejoin a search whose other beams sit out for it, oldest search
        first, and the beams of newer searches sitting out to preempt for its row (none when
        a row is free). Without it every row could sit out for beams that no row is left
        for. None when no search waits so (or a newer one cannot give a row)."""
        searches = sorted(self.searches.values(), key=lambda st: _admitted(st.group))
        for i, state in enumerate(searches):
            members = state.group.members
            behind = [s for s in members if s.status is Status.WAITING]
            if not behind or not any(s.status is Status.RUNNING and self.ahead(s) for s in members):
                continue
            if len(running) < cap:
                return behind[0], []
            newer = {id(st.group) for st in searches[i + 1 :]}
            victims = [s for s in running if id(s.group) in newer and self.ahead(s)]
            if victims:
                return behind[0], [max(victims, key=lambda s: s.admit_order)]
        return None

    # ---- copy on write -----------------------------------------------------------------
    def shared_writes(self, running: list[Sequence]) -> list[Sequence]:
        """The running beams whose next write lands in a block another table holds: each
        needs a fresh block for it this step."""
        bs = self.pool.block_size
        out = []
        for seq in running:
            if seq.group not in self.searches or seq.finished or self.ahead(seq):
                continue  # not a beam; or it writes nothing this step
            pos = seq.num_computed
            table = seq.block_table
            if pos % bs and pos // bs < len(table) and self.pool.refcount(table[pos // bs]) > 1:
                out.append(seq)
        return out

    def copy_on_write(self, seqs: list[Sequence]) -> None:
        """Each of `seqs` writes next into a copy of its shared block (`shared_writes`,
        after growth made room): one fresh block each, copied before the forward."""
        bs = self.pool.block_size
        for seq in seqs:
            i = seq.num_computed // bs
            old = seq.block_table[i]
            if self.pool.refcount(old) < 2:  # an earlier copy this step left it to this beam
                continue
            fresh = self.pool.copy_on_write(seq.id, old)
            seq.block_table[i] = fresh
            self.copies.append((old, fresh))
            self.counters.cow_blocks += 1

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self.copies = self.copies, []
        return copies

    # ---- the rounds --------------------------------------------------------------------
    def select(self) -> tuple[list[Sequence], list[Sequence]]:
        """Every search whose round is complete chooses its beams. Returns the running beams
        whose new hypothesis has no KV here (its beam was preempted), which must compute it
        again as after a preemption; and the beams of the searches that ended (each with its
        hypothesis and finish reason, its status still the engine's to set)."""
        again: list[Sequence] = []
        done: list[Sequence] = []
        for state in list(self.searches.values()):
            beams = state.group.members
            ready = all(self._has_token(s, state.decided) for s in beams)
            if ready and self._round(state, again):
                done += [s for s in beams if s.status is not Status.FINISHED]
        return again, done

    @staticmethod
    def _has_token(seq: Sequence, decided: int) -> bool:
        return (
            seq.num_held == 0
            and len(seq.output_token_ids) == decided + 1
            and len(seq.output_logprobs) > decided
            and seq.output_logprobs[decided] is not None
        )

    def _round(self, state: BeamState, again: list[Sequence]) -> bool:
        """One round's choice; True when the search ended."""
        beams = state.group.members
        sp = state.group.request.sampling
        d, w = state.decided, state.width
        stops = self.stops(beams[0])
        # Each candidate: (cumulative log-probability, beam, rank, token, its logprob)
        sources = beams[:1] if d == 0 else beams  # the first round: every beam the same
        cands = []
        for b, seq in enumerate(sources):
            entry = seq.output_logprobs[d]
            assert entry is not None
            for rank, (token, lp) in enumerate(entry.top):
                cands.append((state.cum[b] + lp, b, rank, token, lp))
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        chosen = []
        for place, (total, b, _, token, lp) in enumerate(cands):
            if token in stops:
                if place < w:  # a finished hypothesis, when among the best W
                    state.finished.append(self._hypothesis(state, beams[b], token, lp, total))
                continue
            chosen.append((total, b, token, lp))
            if len(chosen) == w:
                break
        self.counters.beam_rounds += 1
        length = d + 1
        done = length >= sp.max_tokens or not chosen
        if not done and len(state.finished) >= w:
            state.finished.sort(key=lambda h: -h.score)
            del state.finished[w:]
            best_live = chosen[0][0] / length**sp.length_penalty
            done = state.finished[-1].score >= best_live
        if done:
            if length >= sp.max_tokens:
                state.finished += [
                    self._hypothesis(state, beams[b], t, lp, total) for total, b, t, lp in chosen
                ]
            self._finish(state)
            return True
        again += self._continue(state, chosen)
        return False

    def _hypothesis(
        self, state: BeamState, seq: Sequence, token: int, lp: float, total: float
    ) -> Hypothesis:
        d = state.decided
        entry = seq.output_logprobs[d]
        assert entry is not None
        tokens = [*seq.output_token_ids[:d], token]
        entries = [*seq.output_logprobs[:d], TokenLogprob(lp, entry.top)]
        penalty = state.group.request.sampling.length_penalty
        return Hypothesis(total / len(tokens) ** penalty, tokens, entries)

    def _continue(
        self, state: BeamState, chosen: list[tuple[float, int, int, float]]
    ) -> list[Sequence]:
        """Beam k takes the k-th chosen continuation: its parent's tokens and blocks."""
        beams = state.group.members
        d = state.decided
        old = [
            (list(s.output_token_ids), list(s.output_logprobs), list(s.block_table), s)
            for s in beams
        ]
        again: list[Sequence] = []
        moves: list[tuple[Sequence, list[int], list[int]]] = []  # (beam, its table, new)
        for k, (total, b, token, lp) in enumerate(chosen):
            seq = beams[k]
            out, entries, table, parent = old[b]
            entry = entries[d]
            assert entry is not None
            seq.output_token_ids[:] = [*out[:d], token]
            seq.output_logprobs[:] = [*entries[:d], TokenLogprob(lp, entry.top)]
            state.cum[k] = total
            if b == k or seq.status is not Status.RUNNING:
                continue  # its own blocks; or none (waiting: computed when readmitted)
            if parent.status is not Status.RUNNING:
                again.append(seq)  # its hypothesis's KV is nowhere: computed again
                continue
            written = table[: -(-parent.num_computed // self.pool.block_size)]
            moves.append((seq, list(seq.block_table), written))
            seq.num_computed = parent.num_computed
            seq.prefix_published = min(parent.prefix_published, len(written))
            seq.block_hashes[:] = parent.block_hashes[: seq.prefix_published]
        self.pool.retable([(seq.id, before, new) for seq, before, new in moves])
        bs = self.pool.block_size
        for seq, _, new in moves:  # a table cut to what is written reserves no more slots
            self.counters.kv_overhang_slots -= overhang(seq, bs)
            seq.block_table = list(new)
            self.counters.kv_overhang_slots += overhang(seq, bs)
            self.counters.beam_retables += 1
        del state.cum[len(chosen) :]
        state.decided = d + 1
        if len(chosen) < state.width:
            raise InvariantError(f"{state.group.request.id}: {len(chosen)} beams continue")
        return again

    def _finish(self, state: BeamState) -> None:
        """Beam k holds the k-th best hypothesis, and every beam finishes."""
        beams = state.group.members
        best = sorted(state.finished, key=lambda h: -h.score)[: len(beams)]
        if len(best) < len(beams):
            raise InvariantError(f"{state.group.request.id}: {len(best)} hypotheses")
        stops = self.stops(beams[0])
        for seq, hyp in zip(beams, best, strict=True):
            self.counters.pruned_tokens += len(seq.output_token_ids) - len(hyp.tokens)
            seq.output_token_ids[:] = hyp.tokens
            seq.output_logprobs[:] = hyp.entries
            del seq.token_times[len(hyp.tokens) :]
            seq.stop_ids = stops  # the engine's end checks read them
            seq.finish_reason = "stop" if hyp.tokens[-1] in stops else "length"
        del self.searches[state.group]
