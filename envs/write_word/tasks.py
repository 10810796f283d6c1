"""The `write_word` task set: which word goes into which file, and the worked examples the
prompt shows before the task.

Items are every (file, word) pair of two short lists, in a fixed order in which
neighbours differ in both, so a batch's `item_offset` walks through them, any stretch
of steps sees every file, and a run can be repeated. The worked examples use
files and words that no task uses, so copying an example never solves a task.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

FILES = ("answer.txt", "word.txt", "note.txt", "out.txt")
WORDS = (
    "apple",
    "river",
    "candle",
    "tiger",
    "garden",
    "pencil",
    "orange",
    "cloud",
    "silver",
    "rocket",
    "window",
    "forest",
    "button",
    "planet",
    "yellow",
    "bridge",
)
EXAMPLES = (("notes.txt", "hello"), ("list.txt", "milk"))
"""(file, word) of each worked example; none is a task."""


class WriteWordTask(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str = Field(pattern=r"^[a-z]+\.txt$", description="The file to create, relative to /workspace.")
    word: str = Field(pattern=r"^[a-z]+$", description="Its whole content (a trailing newline is allowed).")

    @property
    def id(self) -> str:
        return f"{self.path.removesuffix('.txt')}-{self.word}"

    def request(self) -> str:
        """The user message that states the task."""
        return f"Create the file {self.path} containing the word {self.word}."


def all_tasks() -> list[WriteWordTask]:
    """Every task once; item i has word i mod 16 and the files shifted by one every 16 items."""
    count = len(FILES) * len(WORDS)
    return [
        WriteWordTask(path=FILES[(i + i // len(WORDS)) % len(FILES)], word=WORDS[i % len(WORDS)]) for i in range(count)
    ]


def worked_examples(count: int) -> list[WriteWordTask]:
    return [WriteWordTask(path=path, word=word) for path, word in EXAMPLES[:count]]
