"""Slurm hostlist expressions expand as `scontrol show hostnames` expands them."""

import pytest

from genbatch.cluster.hostlist import expand_hostlist

# (expression, what `scontrol show hostnames` printed for it on Slurm 22.05)
CASES = [
    ("n1", ["n1"]),
    ("n[1-2]", ["n1", "n2"]),
    ("n[1-3,7]", ["n1", "n2", "n3", "n7"]),
    ("a[08-10]", ["a08", "a09", "a10"]),
    ("a[9-11]", ["a9", "a10", "a11"]),
    ("a[009-011]", ["a009", "a010", "a011"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("rack[1-2]-n[1-2],x", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2", "x"]),
    ("node[1-2],gpu[7-8]", ["node1", "node2", "gpu7", "gpu8"]),
    ("a[1-3],a[2]", ["a1", "a2", "a3", "a2"]),
    ("a[1-2],b", ["a1", "a2", "b"]),
    ("[1-2]", ["1", "2"]),
]


@pytest.mark.parametrize(("expression", "hosts"), CASES)
def test_expand_hostlist(expression, hosts):
    assert expand_hostlist(expression) == hosts


@pytest.mark.parametrize("expression", ["n[1-2", "n1-2]", "n[a-b]", "n[3-1]", "n[[1-2]]", "n[1-]"])
def test_malformed_hostlists_raise_naming_the_expression(expression):
    with pytest.raises(ValueError, match="hostlist"):
        expand_hostlist(expression)


@pytest.mark.slurm
def test_parser_agrees_with_scontrol(slurm_cluster):
    for expression, _ in CASES:
        printed = slurm_cluster.run("scontrol", "show", "hostnames", expression).stdout.split()
        assert expand_hostlist(expression) == printed, expression
