// Apache Curator 5.4 (Debian's libcurator-recipes-java), driven by distlock's
// interop tests.
//
// usage: CuratorPeer HOSTS PATH hold SECONDS   acquire an InterProcessMutex, print "acquired",
//                                             hold, release, print "released"
//        CuratorPeer HOSTS PATH try            print "acquired" or "busy" (waits at most 0.5 s)
//        CuratorPeer HOSTS PATH counter        print a DistributedAtomicLong's value
//        CuratorPeer HOSTS PATH revocable SECONDS  acquire a revocable InterProcessMutex
//                                             (makeRevocable), print "acquired", hold until
//                                             asked to release or SECONDS pass, release, print
//                                             "released as asked" or "released"
//        CuratorPeer HOSTS PATH revoke         Revoker.attemptRevoke on every participant node
//                                             of the mutex at PATH; print "asked N"
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.atomic.DistributedAtomicLong;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.Revoker;
import org.apache.curator.retry.RetryOneTime;

public class CuratorPeer {
    public static void main(String[] args) throws Exception {
        String hosts = args[0], path = args[1], mode = args[2];
        try (CuratorFramework client = CuratorFrameworkFactory.newClient(hosts, new RetryOneTime(100))) {
            client.start();
            if (!client.blockUntilConnected(10, TimeUnit.SECONDS)) {
                throw new IllegalStateException("not connected");
            }
            switch (mode) {
                case "hold": {
                    InterProcessMutex mutex = new InterProcessMutex(client, path);
                    mutex.acquire();
                    System.out.println("acquired");
                    System.out.flush();
                    Thread.sleep((long) (Double.parseDouble(args[3]) * 1000));
                    mutex.release();
                    System.out.println("released");
                    break;
                }
                case "try": {
                    InterProcessMutex mutex = new InterProcessMutex(client, path);
                    boolean got = mutex.acquire(500, TimeUnit.MILLISECONDS);
                    System.out.println(got ? "acquired" : "busy");
                    if (got) {
                        mutex.release();
                    }
                    break;
                }
                case "revocable": {
                    InterProcessMutex mutex = new InterProcessMutex(client, path);
                    CountDownLatch asked = new CountDownLatch(1);
                    // The listener runs on Curator's event thread; the
                    // mutex is released by the thread that holds it.
                    mutex.makeRevocable(m -> asked.countDown());
                    mutex.acquire();
                    System.out.println("acquired");
                    System.out.flush();
                    long millis = (long) (Double.parseDouble(args[3]) * 1000);
                    boolean wasAsked = asked.await(millis, TimeUnit.MILLISECONDS);
                    mutex.release();
                    System.out.println(wasAsked ? "released as asked" : "released");
                    break;
                }
                case "revoke": {
                    int n = 0;
                    for (String node : new InterProcessMutex(client, path).getParticipantNodes()) {
                        Revoker.attemptRevoke(client, node);
                        n++;
                    }
                    System.out.println("asked " + n);
                    break;
                }
                case "counter": {
                    DistributedAtomicLong counter = new DistributedAtomicLong(client, path, new RetryOneTime(100));
                    System.out.println(counter.get().postValue());
                    break;
                }
                default:
                    throw new IllegalArgumentException("unknown mode " + mode);
            }
        }
    }
}
