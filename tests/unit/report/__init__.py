"""Unit tests of tensortorrent_dynamo.report (a package, so that its test modules do not
clash with the integration tests of the same names)."""
