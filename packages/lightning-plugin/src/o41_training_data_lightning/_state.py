"""The datamodule's state: the core's :class:`~o41_training_data.RunState`, in the model checkpoint.

Lightning writes rank 0's checkpoint dict only and hands that same dict to every rank on resume,
so the state holds every rank's position (gathered when it is taken) and each rank picks its own,
or has them moved onto another world, when it is loaded. The document, its versions and every
rule over it are the engine's (docs/checkpoint.md, "A run in one document"); this module only
names its constants as the plugin exported them.
"""

from __future__ import annotations

from o41_training_data import RUN_STATE_FORMAT, RUN_STATE_VERSION

FORMAT = RUN_STATE_FORMAT
"""The ``format`` marker of the state (and of the sidecar index), so it is found among other keys."""
STATE_VERSION = RUN_STATE_VERSION
"""Version of the state ``O41DataModule.state_dict()`` returns and of the sidecar index."""
