"""The kits the whole suite and the benches share: one package, imported by its modules'
names (``from kits.suitekit import MIB``), never re-exported from here.

``suitekit`` holds the constants (units of memory, the checkout's paths, the shared
ledger's layout), each defined once; ``requirekit`` what a test needs from the machine;
``processkit`` servers run as subprocesses; ``cgroupkit`` real memory groups, cgroup v1
on this machine and v2 in the VM of scripts/cgroup-v2, and what the session-group tests
of both run; ``cgroup_trees`` cgroup trees built from the captures in tests/fixtures/cgroup/;
``adapterkit`` the chart README's prometheus-adapter rules. pytest puts tests/ on
``sys.path`` (its conftest.py), the benches put it there themselves (bench/benchkit.py),
and scripts/check gives it to mypy (``MYPYPATH``). A helper only one folder of tests
uses stays beside those tests (``tests/middleware/mwkit.py``, ...).
"""
