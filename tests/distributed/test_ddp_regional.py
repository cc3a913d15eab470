"""DDP over a ModuleList of identical blocks (issue 31): the graph compiled inside DDP's forward is
split at the blocks, not at DDP's buckets, and the block is compiled once for all twelve calls
(``ember/backends/regional.py``: ``split_for_ddp``). Each block's backward is its own autograd node,
so DDP's bucket hooks fire as blocks finish, as with the bucket split. Two gloo processes on CPU."""
from __future__ import annotations

import pytest
import torch

from tests.distributed.test_ddp import assert_same_training, launch

BLOCKS = 12


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("ddp_regional"), "ddp_blocks,ddp_blocks_off,ddp_blocks_whole", "aot_eager")


@pytest.mark.parametrize("name", ["ddp_blocks", "ddp_blocks_off", "ddp_blocks_whole"])
def test_gradients_equal_eager_ddp(results, name):
    for rank_results in results:
        assert_same_training(rank_results[name])
    torch.testing.assert_close(results[0][name]["got"][1], results[1][name]["got"][1])


def test_one_block_compile_for_twelve_blocks(results):
    for rank_results in results:
        res = rank_results["ddp_blocks"]
        assert res["split_by"] == ["regional"], res
        assert res["parts"] == [BLOCKS + 1], res  # the stem, then one part per block: each its own autograd node
        assert res["regional"].get("compiles") == 2, res["regional"]  # the stem and the block, once
        assert res["regional"].get("reuses") == BLOCKS - 1, res["regional"]


def test_regional_ddp_off_splits_at_buckets(results):
    for rank_results in results:
        res = rank_results["ddp_blocks_off"]
        assert res["split_by"] == ["ddp_buckets"], res
        assert not res["regional"].get("compiles"), res["regional"]


@pytest.mark.parametrize("name", ["ddp_blocks", "ddp_blocks_off"])
def test_buckets_launch_while_the_backward_runs(results, name):
    # each block's backward is its own autograd node: the all-reduces of the blocks' buckets start
    # before the backward reaches the stem (a whole graph would launch every bucket at its end)
    for rank_results in results:
        res = rank_results[name]
        assert res["buckets"] > BLOCKS, res["buckets"]
        assert res["buckets_before_stem"] >= BLOCKS, (res["buckets_before_stem"], res["buckets"])


def test_a_whole_graph_launches_its_buckets_at_the_end(results):
    # the contrast (optimize_ddp off: one graph, one autograd node): what the test above tells apart
    for rank_results in results:
        res = rank_results["ddp_blocks_whole"]
        assert res["parts"] == [1] and res["buckets_before_stem"] < BLOCKS, res["buckets_before_stem"]
