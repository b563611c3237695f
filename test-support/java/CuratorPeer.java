// Apache Curator 5.4 (Debian's libcurator-recipes-java), driven by distlock's
// interop tests.
//
// usage: CuratorPeer HOSTS PATH hold SECONDS   acquire an InterProcessMutex, print "acquired",
//                                             hold, release, print "released"
//        CuratorPeer HOSTS PATH try            print "acquired" or "busy" (waits at most 0.5 s)
//        CuratorPeer HOSTS PATH counter        print a DistributedAtomicLong's value
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.atomic.DistributedAtomicLong;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
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
