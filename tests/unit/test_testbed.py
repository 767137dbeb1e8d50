"""Testbed reuse: a container of the same name made by another checkout is replaced (or, when it
is not a test host at all, refused with one sentence), never silently reused."""
from nemofleet.testbed import DIR_LABEL, OWNER_LABEL, reuse_decision

PUB = "ssh-ed25519 AAAAC3Nz-mine nemofleet-testbed\n"
NAME = "nf-tb-h200-1"


def test_no_container_is_created():
    assert reuse_decision(NAME, None, "f00d", PUB) == ("create", None)


def test_our_own_host_is_reused():
    assert reuse_decision(NAME, {"nemofleet.testbed": "1", OWNER_LABEL: "f00d"}, "f00d", PUB) == ("reuse", None)


def test_unlabelled_host_that_takes_our_key_is_reused():
    labels = {"nemofleet.testbed": "1"}  # made before the owner label existed
    assert reuse_decision(NAME, labels, "f00d", PUB, authorized=PUB) == ("reuse", None)


def test_another_checkouts_host_is_replaced_with_a_sentence():
    labels = {"nemofleet.testbed": "1", OWNER_LABEL: "beef", DIR_LABEL: "/work/other/.testbed"}
    action, why = reuse_decision(NAME, labels, "f00d", PUB, here="/work/main/.testbed")
    assert action == "replace"
    assert why == ("nf-tb-h200-1 is a test host of another testbed (/work/other/.testbed) that does not accept "
                   "this testbed's SSH key (/work/main/.testbed); replacing it (set NEMOFLEET_TESTBED_NAME to keep both)")
    action, why = reuse_decision(NAME, {"nemofleet.testbed": "1"}, "f00d", PUB, authorized="ssh-ed25519 other x\n")
    assert action == "replace" and "an older checkout" in why


def test_a_foreign_container_of_that_name_is_refused():
    action, why = reuse_decision(NAME, {"maintainer": "someone"}, "f00d", PUB)
    assert action == "refuse"
    assert why == ("a container named nf-tb-h200-1 exists and is not a nemofleet test host; remove it "
                   "(docker rm -f nf-tb-h200-1) or choose another prefix with NEMOFLEET_TESTBED_NAME")
    assert reuse_decision(NAME, {}, "f00d", PUB)[0] == "refuse"
