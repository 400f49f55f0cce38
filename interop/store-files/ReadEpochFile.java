// RocketMQ's own reader of an epoch file (EpochFileCache, rocketmq-store 5.5.0), so a test can
// show that a file rmqha wrote is what RocketMQ reads.  Not part of the interop Maven build:
// tests/interop/test_store_files.py runs it with Java's source launcher on the classpath of
// benches/peers/maven/rocketmq (`make peers-jars`), which holds rocketmq-store.
//
// Usage: java -cp <classpath> ReadEpochFile.java <epochFileCheckpoint>
// Prints one line per entry, "epoch startOffset endOffset" (nothing for a file whose entry
// count or CRC does not match: RocketMQ then reads the .bak, and no entries when it is missing),
// or exits 2 when the file cannot be read at all (EpochFileCache.initCacheFromFile() false).
import java.util.List;
import org.apache.rocketmq.remoting.protocol.EpochEntry;
import org.apache.rocketmq.store.ha.autoswitch.EpochFileCache;

public class ReadEpochFile {
    public static void main(String[] args) {
        EpochFileCache cache = new EpochFileCache(args[0]);
        if (!cache.initCacheFromFile()) {
            System.err.println("EpochFileCache could not load " + args[0]);
            System.exit(2);
        }
        List<EpochEntry> entries = cache.getAllEntries();
        for (EpochEntry e : entries) {
            System.out.println(e.getEpoch() + " " + e.getStartOffset() + " " + e.getEndOffset());
        }
    }
}
