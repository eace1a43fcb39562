import os
import threading
import time

from benchmarks.server_process import cpu_seconds_since, thread_cpu_ns


def test_a_process_cpu_time_counts_a_short_burst_on_another_thread_to_the_millisecond():
    spun, done, release = {}, threading.Event(), threading.Event()

    def spin():
        start = time.thread_time()
        while time.thread_time() - start < 0.005:
            pass
        spun[threading.get_native_id()] = time.thread_time() - start
        done.set()
        release.wait()

    before = thread_cpu_ns(os.getpid())
    worker = threading.Thread(target=spin)
    worker.start()
    done.wait()
    measured = cpu_seconds_since(os.getpid(), before)
    after = thread_cpu_ns(os.getpid())
    release.set()
    worker.join()
    [(tid, burst)] = spun.items()
    # the worker's own reading, apart from whatever other threads of this process ran meanwhile; a clock-tick count
    # (/proc/PID/stat) would read 0 or 10 ms here
    assert tid not in before and burst <= after[tid] / 1e9 < burst + 0.002
    assert measured >= burst
