"""The test broker's cluster id never reads as an option to Kafka's storage tool (a CI run drew ``-vYx…``)."""

from tests.support.kafka import new_cluster_id


def test_cluster_ids_never_start_with_a_dash():
    ids = [new_cluster_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert not [cluster_id for cluster_id in ids if cluster_id.startswith("-")]
    assert all(len(cluster_id) == 22 for cluster_id in ids)
