"""Shared by the inference tests that send several requests at once: each call in its own thread."""

import threading


def at_once(call, arguments, timeout_s):
    """``call(*args)`` for every tuple in ``arguments``, each in its own thread, all
    started before the first is joined (each join bounded by ``timeout_s``):
    ({args: result}, [exceptions raised])."""
    results, errors = {}, []

    def one(args):
        try:
            results[args] = call(*args)
        except Exception as e:  # counted by the caller: a refusal is a failure
            errors.append(e)

    threads = [threading.Thread(target=one, args=(tuple(args),)) for args in arguments]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    return results, errors
