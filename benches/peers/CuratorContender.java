// Apache Curator 5.4's InterProcessMutex as one contending process of the
// cross-process bench (compiled by `--bench processes` against Debian's
// libcurator-recipes-java, like test-support/java/).
//
// usage: CuratorContender HOSTS PATH ID BARRIER
//
// Before it says ready, it takes and releases a private lock for 1.5 s
// (JIT warm-up).
//
// Prints the same lines as the `contender` binary: "ready,ID", then after the
// barrier one "acq,ID,0,ACQUIRE_NS,RELEASE_NS,WAIT_NS" per acquisition
// (System.nanoTime, CLOCK_MONOTONIC on Linux), then "done,ID,COUNT,ERRORS".
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;

public class CuratorContender {
    public static void main(String[] args) throws Exception {
        String hosts = args[0], path = args[1], id = args[2];
        Path barrier = Paths.get(args[3]);
        try (CuratorFramework client = CuratorFrameworkFactory.newClient(hosts, new RetryOneTime(100))) {
            client.start();
            if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
                throw new IllegalStateException("not connected");
            }
            // Warm the JIT up on a private lock first (1.5 s), so the run
            // measures Curator, not the JVM's interpreter.
            InterProcessMutex warm = new InterProcessMutex(client, path + "-warmup-" + id);
            long warmEnd = System.nanoTime() + 1_500_000_000L;
            while (System.nanoTime() < warmEnd) {
                warm.acquire();
                warm.release();
            }
            InterProcessMutex mutex = new InterProcessMutex(client, path);
            System.out.println("ready," + id);
            System.out.flush();
            long start, end;
            while (true) {
                if (Files.exists(barrier)) {
                    String[] parts = new String(Files.readAllBytes(barrier)).trim().split("\\s+");
                    if (parts.length >= 2) {
                        start = Long.parseLong(parts[0]);
                        end = Long.parseLong(parts[1]);
                        break;
                    }
                }
                Thread.sleep(1);
            }
            long now = System.nanoTime();
            if (start > now) {
                TimeUnit.NANOSECONDS.sleep(start - now);
            }
            long[] acq = new long[1 << 16], rel = new long[1 << 16], wait = new long[1 << 16];
            int n = 0, errors = 0;
            while (System.nanoTime() < end && n < acq.length) {
                long called = System.nanoTime();
                boolean got;
                try {
                    got = mutex.acquire(end - called, TimeUnit.NANOSECONDS);
                } catch (Exception e) {
                    errors++;
                    System.err.println("curator " + id + ": " + e);
                    Thread.sleep(10);
                    continue;
                }
                if (!got) {
                    break;
                }
                long acquired = System.nanoTime();
                long released = System.nanoTime();
                mutex.release();
                acq[n] = acquired;
                rel[n] = released;
                wait[n] = acquired - called;
                n++;
            }
            StringBuilder out = new StringBuilder();
            for (int i = 0; i < n; i++) {
                out.append("acq,").append(id).append(",0,").append(acq[i]).append(',')
                        .append(rel[i]).append(',').append(wait[i]).append('\n');
            }
            out.append("done,").append(id).append(',').append(n).append(',').append(errors).append('\n');
            System.out.print(out);
            System.out.flush();
        }
    }
}
