"""One request's way through the mesh, below the router that starts it.

Ownership, top down (each module imports only those under it; ``tests/unit/architecture``
checks it, imports for annotations included):

    completions.py    a request's n completions, one flow each, merged into one stream
    flow.py           RequestFlow: the lifecycle (route, reserve + prefill, decode, migrate)
      caller_stream.py  the stream as the caller sees it: span, request metrics, abort
      handoff.py        the prefill -> decode hand-off (prefill_call.py, reservation.py)
      first_token.py    relaying the prefill worker's first token
    state.py          RequestState: ids, deadline, the current call; leave_decode
      failover.py       which decode worker a request goes on with after its own failed
    mesh.py           RouterMesh: what a request asks of the router (Router provides it)
    stats.py          RouterStats: the router's counters of what requests did
    streams.py        merging async streams
"""
