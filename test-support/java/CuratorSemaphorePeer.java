// Apache Curator 5.4 (Debian's libcurator-recipes-java) InterProcessSemaphoreV2, driven by
// distlock's semaphore interop tests.
//
// usage: CuratorSemaphorePeer HOSTS PATH hold PERMITS SECONDS   acquire one lease (waiting as long
//                                                              as it takes), print "acquired",
//                                                              hold for SECONDS or until a line
//                                                              (or the end) of standard input,
//                                                              return it, print "released"
//        CuratorSemaphorePeer HOSTS PATH try PERMITS            print "acquired" (and return the
//                                                              lease) or "busy" (waits at most
//                                                              0.5 s)
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryOneTime;

public class CuratorSemaphorePeer {
    private static void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        String hosts = args[0], path = args[1], mode = args[2];
        int permits = Integer.parseInt(args[3]);
        try (CuratorFramework client = CuratorFrameworkFactory.newClient(hosts, new RetryOneTime(100))) {
            client.start();
            if (!client.blockUntilConnected(10, TimeUnit.SECONDS)) {
                throw new IllegalStateException("not connected");
            }
            InterProcessSemaphoreV2 semaphore = new InterProcessSemaphoreV2(client, path, permits);
            switch (mode) {
                case "hold": {
                    Lease lease = semaphore.acquire();
                    say("acquired");
                    CountDownLatch told = new CountDownLatch(1);
                    Thread reader = new Thread(() -> {
                        try {
                            System.in.read();
                        } catch (java.io.IOException e) {
                            // the end of the input, as far as we are concerned
                        }
                        told.countDown();
                    });
                    reader.setDaemon(true);
                    reader.start();
                    told.await((long) (Double.parseDouble(args[4]) * 1000), TimeUnit.MILLISECONDS);
                    semaphore.returnLease(lease);
                    say("released");
                    break;
                }
                case "try": {
                    Lease lease = semaphore.acquire(500, TimeUnit.MILLISECONDS);
                    say(lease != null ? "acquired" : "busy");
                    if (lease != null) {
                        semaphore.returnLease(lease);
                    }
                    break;
                }
                default:
                    throw new IllegalArgumentException("unknown mode " + mode);
            }
        }
    }
}
