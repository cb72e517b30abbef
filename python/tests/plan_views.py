"""Helpers shared by the Python tests that read a plan's per-rank views."""


def covered_tokens(plan, layout):
    """Every (sequence, position) held in `layout` ('linear' or 'attention') over all ranks."""
    tokens = []
    for r in range(plan.ranks):
        for view in plan.rank(r).micro_batches:
            for piece in getattr(view, layout):
                tokens.extend((piece.sequence_id, p) for p in range(piece.begin, piece.end))
    return sorted(tokens)
