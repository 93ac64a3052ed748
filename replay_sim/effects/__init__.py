"""Which tools change a server's state: declared, or learned from what the recordings show.

Replay chooses among the recordings of a call by the *state* they were made from — the
state-changing calls before them in their session (:mod:`replay_sim.resolve.lineage`) — so it
must know which calls change state. A tool's :class:`Effect` is, in this order of precedence:

1. declared by the matching config (``read_only``): final;
2. declared by the server: ``readOnlyHint: true`` says it changes nothing — until the recordings
   show otherwise (a read-only hint can hide state: a tool that numbers what it was told); an
   explicit ``readOnlyHint: false`` (or, without it, ``destructiveHint: true``) says it changes
   state, and no read that saw nothing change overrides that;
3. otherwise learned from the recordings, :attr:`Effect.UNKNOWN` (treated as changing) until then.

**Evidence.** A recorded call was made from a *state*: the calls before it in its session whose
tools are not known to be effect-free (failed calls, dry runs and non-tool requests change nothing).
Two recordings of one call (same key) are compared when nothing but calls of one tool ``T`` lies
between their states — a read recorded before and after ``T`` in one session, with only ``T`` and
effect-free calls between; or, across sessions (which all start from the server's initial state),
one's state extended by calls of ``T`` only:

- the same successful answer is a *witness* that ``T`` changes nothing that read can see — except
  that a tool witnesses its own effect only when its answers vary (a write that always says "ok"
  shows nothing by repeating it), and only for the calls of ``T`` the read *covers*
  (:func:`covers`): a call that names a thing (a path, a name, a key, an id, a table) is witnessed
  only by a read that names it too (or the folder of a path it names), or whose answer shows it —
  reading ``b.txt`` shows nothing about writing ``a.txt`` — and only when the call would have
  changed something the read shows (:func:`can_show`): a find/replace of a pattern the read did not
  show, or a call whose answer says it did nothing (``0 replacements``), changed nothing because of
  its arguments, and witnesses nothing;
- a different answer shows that ``T`` changes state, whatever it is annotated;
- two recordings from the *same* state that disagree show the model wrong: the call's own tool
  depends on history (it keeps hidden state), or else the effect-free calls between them are not.

A tool is :attr:`Effect.NONE` only with witnesses of at least two different calls of it (argument
sets: one call unchanged says little — the read may not show that part of the state) and no
contrary evidence. Learning one tool
effect-free shortens states, which can make other recordings comparable: :func:`learn` iterates
to a fixpoint, and starts over whenever a tool it relied on turns out to change state. A
:class:`Learner` learns again as sessions grow (a served store, every batch of answers): each pass's
evidence is kept (:mod:`replay_sim.effects.evidence`) and only the calls added are compared, with
the verdicts of :func:`learn` over all of them.

What no recorded read saw, no evidence shows: a write whose effect no recorded read observed can be
learned effect-free. The recorder's effect probes (:mod:`replay_sim.record.explore`) re-read what a
session read before, choosing reads that share an argument with the call first; the matching
config's ``read_only = false`` settles a tool for good.
"""

from replay_sim.effects.kinds import kind_of
from replay_sim.effects.learning import Learner, learn
from replay_sim.effects.model import Call, Declaration, Effect, Pair, Verdict, declare, repeatable
from replay_sim.effects.sensitivity import can_show, did_nothing, selected
from replay_sim.effects.things import covers, named

__all__ = [
    "Call",
    "Declaration",
    "Effect",
    "Learner",
    "Pair",
    "Verdict",
    "can_show",
    "covers",
    "declare",
    "did_nothing",
    "kind_of",
    "learn",
    "named",
    "repeatable",
    "selected",
]
