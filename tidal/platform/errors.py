"""An error as the scheduler stores it and as its one line (`tidal status`, `tidal events`)."""

from __future__ import annotations


def error_text(e: Exception) -> tuple[str, str]:
    """A run's or launch's error as stored (at most 4,000 characters) and as its one-line note
    (`error_note`). A longer text keeps its note, then its end: the note of what is stored is
    the same line (`tidal status` and `tidal events` say the same)."""
    text = f"{type(e).__name__}: {e}"
    note = error_note(text)
    if len(text) > 4000:
        text = f"{note}\n[...]\n{text[-(4000 - len(note) - 7):]}"
    return text, note


def error_note(text: str) -> str:
    """An error text's one line: its first line; when it carries a traceback, the traceback's
    last line, which names the exception raised; when its first line announces more (ends with
    ':'), that line and the text's last. Ray Train's `WorkerGroupError` starts "Training failed
    due to worker errors:" and ends with the worker's traceback (e.g. `...NonFiniteLoss:
    non-finite loss at step 30: nan`); its `ControllerError` is "Training failed due to
    controller error:" and the controller's error, without a traceback."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return ""
    if "Traceback (most recent call last):" in text:
        note = lines[-1]
    elif len(lines) > 1 and lines[0].endswith(":"):
        note = f"{lines[0]} {lines[-1]}"
    else:
        note = lines[0]
    return note[:160]
