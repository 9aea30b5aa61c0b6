"""Builders and rigs the tests share: fleets, arms, recordings, launch. Imported as
``support.<module>`` (pytest.ini puts test/ on the path)."""
