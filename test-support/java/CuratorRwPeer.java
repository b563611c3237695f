// Apache Curator 5.4 (Debian's libcurator-recipes-java) InterProcessReadWriteLock, driven by
// distlock's interop tests.
//
// usage: CuratorRwPeer HOSTS PATH read-hold SECONDS   take the read lock, print "acquired",
//                                                    hold, release, print "released"
//        CuratorRwPeer HOSTS PATH write-hold SECONDS  the same with the write lock
//        CuratorRwPeer HOSTS PATH read-try            print "acquired" (then "released") or
//                                                    "busy" (waits at most 0.5 s)
//        CuratorRwPeer HOSTS PATH write-try           the same with the write lock
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.retry.RetryOneTime;

public class CuratorRwPeer {
    public static void main(String[] args) throws Exception {
        String hosts = args[0], path = args[1], mode = args[2];
        String[] parts = mode.split("-", 2);
        if (parts.length != 2 || !(parts[0].equals("read") || parts[0].equals("write"))) {
            throw new IllegalArgumentException("unknown mode " + mode);
        }
        try (CuratorFramework client = CuratorFrameworkFactory.newClient(hosts, new RetryOneTime(100))) {
            client.start();
            if (!client.blockUntilConnected(10, TimeUnit.SECONDS)) {
                throw new IllegalStateException("not connected");
            }
            InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client, path);
            InterProcessMutex lock = parts[0].equals("read") ? rw.readLock() : rw.writeLock();
            switch (parts[1]) {
                case "hold": {
                    lock.acquire();
                    System.out.println("acquired");
                    System.out.flush();
                    Thread.sleep((long) (Double.parseDouble(args[3]) * 1000));
                    lock.release();
                    System.out.println("released");
                    break;
                }
                case "try": {
                    boolean got = lock.acquire(500, TimeUnit.MILLISECONDS);
                    System.out.println(got ? "acquired" : "busy");
                    if (got) {
                        lock.release();
                        System.out.println("released");
                    }
                    break;
                }
                default:
                    throw new IllegalArgumentException("unknown mode " + mode);
            }
        }
    }
}
