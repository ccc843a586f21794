"""``sqla-queue demo``: a small shop that enqueues jobs inside its own transactions.

:mod:`sqla_queue.demo.shop` is the application (models, queue, task) and reads like one
would in a real project; :mod:`sqla_queue.demo.run` places orders, starts worker processes
and checks the outcome; :mod:`sqla_queue.demo.command` is its sub-command, which
:mod:`sqla_queue.__main__` adds to the command line.
"""
