def pytest_configure(config):
    config.addinivalue_line(
        "markers", "extended: a fault run only `make chaos` runs (not `make test`), with the reason in its docstring")
