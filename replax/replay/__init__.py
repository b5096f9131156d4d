"""The on-device replay store and what decides what it holds and serves.

- `store`: the ring buffer of rollouts (tokens, behaviour log-probs, rewards, ages),
  sharded along its rows, with the compiled add-and-sample.
- `pools`: sampling weights over the stored rollouts (uniform, recency, priority).
- `designs`: named replay designs (capacity, batch, ratio) from the paper.
- `schedules`: when a step generates and how old a replayed rollout may be.
- `auto`: auto mode's controller, which plans both online from measured times.

May import: core.
"""
