"""`one_batch_ahead`, the look-ahead both the train loader and `accelerator.prepare(dataloader)` iterate with."""

from __future__ import annotations

from hf_lightning.data.dataloaders import HFDataLoader, one_batch_ahead


def test_the_last_item_is_announced_before_it_is_yielded_and_the_end_after_it():
    events: list = []

    def start():
        events.append("start")
        return iter("abc")

    iterator = one_batch_ahead(start, before_last=lambda item: events.append(("last", item)),
                               after_last=lambda: events.append("end"))
    assert events == []  # lazy: nothing is drawn before the first item is asked for
    for item in iterator:
        events.append(item)
    assert events == ["start", "a", "b", ("last", "c"), "c", "end"]


def test_an_empty_iteration_announces_nothing():
    events: list = []
    assert list(one_batch_ahead(lambda: iter(()), lambda item: events.append(item), lambda: events.append("end"))) == []
    assert events == []


def test_the_train_loader_counts_only_completed_iterations_and_reads_its_skip_when_drawing():
    loader = HFDataLoader(list(range(6)), batch_size=2)
    iterator = iter(loader)
    loader.skip_first_batches_once(1)  # set after iter(), before the first batch: still honoured
    assert [batch.tolist() for batch in iterator] == [[2, 3], [4, 5]]
    assert loader.iteration == 1
    partial = iter(loader)
    next(partial)
    assert loader.iteration == 1  # not completed
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5]] and loader.iteration == 2


def test_a_resume_skip_holds_with_worker_processes_and_is_spent_by_one_epoch():
    """torch's multi-worker iterator iterates the index sampler twice when it is created (once in its base
    `__init__`, once in `_reset`): the skip must survive the first, unused iteration, and a persistent-worker
    iterator must not repeat it in the next epoch."""
    for persistent in (False, True):
        loader = HFDataLoader(list(range(8)), batch_size=2, num_workers=2, persistent_workers=persistent)
        loader.skip_first_batches_once(2)
        assert [batch.tolist() for batch in loader] == [[4, 5], [6, 7]]
        assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        loader.skip_first_batches_once(1)
        assert [batch.tolist() for batch in loader] == [[2, 3], [4, 5], [6, 7]]
