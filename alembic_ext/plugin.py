"""The ``alembic.plugins`` entry point (Alembic 1.18+).

With the entry point installed, Alembic loads this module at start-up, so ``op.create_queue``
and the autogenerate hook exist in every Alembic environment, even one whose ``env.py`` does
not import ``alembic_ext``. On older Alembic releases ``import alembic_ext`` in ``env.py``
does the same.
"""

from __future__ import annotations

from typing import Any

from alembic_ext._registration import install

__all__ = ["PLUGIN_NAME", "setup"]

#: The entry point's name, as Alembic lists the plugin.
PLUGIN_NAME = "sqla_queue"


def setup(plugin: Any) -> None:
    """Called by Alembic with its ``Plugin`` object; registers everything via :func:`install`.

    The comparator is deliberately not added with ``plugin.add_autogenerate_comparator``:
    Alembic would run it only in environments that list this plugin in
    ``autogenerate_plugins``, and everywhere else the queue's tables would come out as
    ``create_table`` calls. See :mod:`alembic_ext._registration`.
    """
    install()
