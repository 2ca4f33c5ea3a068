"""What server and client share: the wire format, endpoint names, supervision math and the p2p path."""
