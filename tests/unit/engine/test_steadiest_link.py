"""Which links are the steadiest of a group: one capped interface read by all the ranks of its host
is the host's link (every rank on it), while a rank of the same host on a link of its own (another
byte rate) is not swept in with it."""

from __future__ import annotations

import numpy as np

from eroica.engine.links import _steadiest


def test_the_ranks_that_read_one_capped_interface_are_all_the_steadiest() -> None:
    cvs = np.array([3.1, 3.4, 0.55, 0.6, 3.0, 3.6, 2.9, 3.3])
    means = np.array([4.1e7, 3.8e7, 9.0e6, 9.2e6, 4.0e7, 3.9e7, 4.2e7, 3.7e7])
    hosts = ["h0", "h0", "h1", "h1", "h2", "h2", "h3", "h3"]
    assert np.flatnonzero(_steadiest(cvs, means, hosts)).tolist() == [2, 3]


def test_a_rank_on_the_same_host_with_a_link_of_its_own_is_not_swept_in() -> None:
    # one namespace per rank on one machine: the same host name, each rank its own veth and rate
    cvs = np.array([3.1, 0.5, 0.7, 3.2])
    means = np.array([4.0e7, 9.0e6, 3.5e7, 4.1e7])
    assert np.flatnonzero(_steadiest(cvs, means, ["m"] * 4)).tolist() == [1]
