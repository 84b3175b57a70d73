"""A group's setup report crosses as data (the core's `SetupReport`: the TCP streams per peer and
what chose them), and Python composes the line WIRESPEED_SETUP_STATS prints from it."""
from wirespeed.native.rendezvous import streams_line


def test_the_streams_line_says_what_the_probe_chose():
    probed = (12, 9, False, 0.031, [(1, 3.5e7), (2, 7.0e7), (4, 1.2e8)])
    assert streams_line(probed) == ("TCP streams per peer: 9 used of 12 opened (probe 31 ms, Gbit/s each "
                                    "way by streams 1: 0.280, 2: 0.560, 4: 0.960)")
    assert streams_line((4, 4, True, 0.0, [])) == "TCP streams per peer: 4 used of 4 opened (WIRESPEED_NSTREAMS is set)"
    assert streams_line((1, 1, False, 0.0, [])) == ("TCP streams per peer: 1 used of 1 opened (one stream opened, "
                                                    "nothing to probe)")
