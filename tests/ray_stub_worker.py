"""A rollout worker without a model or environments, for tests of how `RayRollout` waits.

It answers every call at once, unless a file in its folder (`run.env_kwargs.stub_folder`)
says otherwise: `hang-METHOD` makes every call of METHOD sleep for an hour, and
`crash-METHOD` makes the first call of METHOD anywhere end its process (the file is
taken atomically, so one worker dies, once). Ray workers import it by name; the test's
Ray puts this folder on their import path.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path


class StubWorker:
    """`RolloutWorker`'s calls and answers (incarnation, value), played by files."""

    def __init__(self, config, model_name, envs, threads):
        self.folder = Path(config.run.env_kwargs["stub_folder"])
        self.incarnation = uuid.uuid4().hex

    def _act(self, method: str) -> None:
        try:
            os.unlink(self.folder / f"crash-{method}")
        except FileNotFoundError:
            pass
        else:
            os._exit(1)  # no cleanup, no exception: as a killed process
        if (self.folder / f"hang-{method}").exists():
            time.sleep(3600)

    def hello(self):
        self._act("hello")
        return self.incarnation, "cpu"

    def load_weights(self, named_tensors):
        self._act("load_weights")
        return self.incarnation, None

    def collect(self, submission):
        self._act("collect")
        return self.incarnation, []

    def close(self):
        self._act("close")
