"""The ``arrowlake`` command line."""
