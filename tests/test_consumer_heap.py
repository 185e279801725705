"""The consumers' start leaves the start-up heap out of later garbage collections, once per
process (consumers._freeze_startup_heap): checked in a fresh interpreter, where nothing else
froze anything."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from support import ALPHA_BETA_GAMMA, MERGE_NONE, write_each

CHECK = textwrap.dedent("""
    import gc, sys
    from bmad_loop.engine.run.consumers import ConsumerSet
    from bmad_loop.engine.project import Project
    from bmad_loop.policy import load_policy

    root = sys.argv[1]
    project = Project(root=root, policy=load_policy(root))
    before = gc.get_freeze_count()
    first = ConsumerSet(project, workers=1)
    first.start()
    after_first = gc.get_freeze_count()
    first.stop()
    made_since = [[i] for i in range(1000)]  # lists: tracked, so a second freeze would take them
    second = ConsumerSet(project, workers=1)
    second.start()
    after_second = gc.get_freeze_count()
    second.stop()
    project.close()
    print(before, after_first, after_second)
""")


def test_the_start_up_heap_is_frozen_at_the_first_consumer_start_and_only_then(make_repo):
    repo = make_repo(ALPHA_BETA_GAMMA, script=write_each(ALPHA_BETA_GAMMA),
                     policy=MERGE_NONE.format(n=1, strategy="merge"))
    proc = subprocess.run([sys.executable, "-c", CHECK, str(repo.root)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    before, after_first, after_second = map(int, proc.stdout.split())
    assert before == 0
    assert after_first > 1000  # modules, the ORM's mappers: the interpreter's start-up
    assert after_second == after_first  # objects made later stay collectable
